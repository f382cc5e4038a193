"""Worker of the real-model test (``test_real_model.py``): SmolLM2-135M-Instruct loaded from
its GGUF file on each rank, fine-tuned by ``hfcompress.Trainer`` under FSDP2 with bf16 mixed
precision and ``sdp4bit`` on 2 gloo processes as 2 emulated nodes, a few steps on one fixed
sequence of real text per rank (one sequence of a few tokens: bf16 matmuls are emulated on
CPUs without native bf16, ~20x slower than fp32, and their cost grows with the tokens, while
the compressed bytes depend on the parameters only)."""

from __future__ import annotations

import os
import warnings

import torch

TEXT = ("Now is the winter of our discontent made glorious summer by this sun of York; and "
        "all the clouds that lour'd upon our house in the deep bosom of the ocean buried.")


class FixedBatch(torch.utils.data.Dataset):
    def __init__(self, ids: torch.Tensor, copies: int) -> None:
        self.ids, self.copies = ids, copies

    def __len__(self) -> int:
        return self.copies

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids, "labels": self.ids}


def finetune_worker(rank: int, world: int, out: str, steps: int, seq: int) -> dict:
    # MASTER_ADDR / MASTER_PORT: the launcher's free port (not a fixed one: pytest -n 2)
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": "0",
                       "LOCAL_WORLD_SIZE": "1", "OMP_NUM_THREADS": "1"})
    warnings.filterwarnings("ignore", category=FutureWarning)
    from transformers.utils import logging
    logging.set_verbosity_error()
    import hfcompress
    from hfcompress.models import load_causal_lm, load_tokenizer

    model = load_causal_lm("smollm2-135m")
    master_dtypes = {p.dtype for p in model.parameters()}
    tok = load_tokenizer("smollm2-135m")
    ids = tok(TEXT, return_tensors="pt").input_ids[0, :seq]
    args = hfcompress.TrainingArguments(
        output_dir=out, max_steps=steps, per_device_train_batch_size=1, logging_steps=1,
        learning_rate=1e-4, warmup_steps=0, lr_scheduler_type="constant", report_to=[],
        save_strategy="no", disable_tqdm=True, seed=0, dataloader_num_workers=0, fsdp=True,
        fsdp_config={"version": 2}, comm_compressor="sdp4bit", ranks_per_node=1, bf16=True)
    trainer = hfcompress.Trainer(model=model, args=args,
                                 train_dataset=FixedBatch(ids, world * steps))
    trainer.train()
    hist = trainer.state.log_history
    return {"master_dtypes": master_dtypes, "n_params": sum(p.numel() for p in
                                                            model.parameters()),
            "trained_dtypes": {p.to_local().dtype if hasattr(p, "to_local") else p.dtype
                               for p in trainer.model.parameters()},
            "losses": [h["loss"] for h in hist if "loss" in h],
            "comm": [{k: v for k, v in h.items() if k.startswith("comm/")} for h in hist
                     if "loss" in h]}
