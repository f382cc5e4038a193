"""Worker functions of ``test_trl_peft.py`` (``dist_utils.run_distributed``): TRL's
``SFTTrainer`` with ``hfcompress.CompressionMixin`` on 2 gloo processes under FSDP2 (2
emulated nodes, ``ranks_per_node=1``), on a tiny LLaMA and a byte-level BPE tokenizer trained
on 32 local arithmetic sentences (no download)."""

from __future__ import annotations

import os

from trainer_workers import LogCapture, comm_logs, losses, meter_steps, setup

VOCAB = 320       # the 256 bytes, <|endoftext|>, 63 merges
LR = 3e-3


def sentences() -> list[str]:
    return [f"{a} plus {b} is {a + b}." for a in range(2, 10) for b in (1, 3, 4, 7)]


def sft_pieces():
    """(model, tokenizer, dataset): every rank builds the same ones."""
    from datasets import Dataset
    from hfcompress.data import train_tokenizer
    from hfcompress.testing import tiny_llama

    tok = train_tokenizer(sentences(), vocab_size=VOCAB)
    model = tiny_llama(vocab_size=len(tok), num_key_value_heads=2)
    return model, tok, Dataset.from_dict({"text": sentences()})


def sft_train(out: str, preset: str | None, steps: int, peft_config=None, **extra):
    """One ``SFTTrainer`` run with the mixin; returns (trainer, captured on_log dicts)."""
    import hfcompress
    from trl import SFTConfig, SFTTrainer

    class CompressedSFTTrainer(hfcompress.CompressionMixin, SFTTrainer):
        pass

    os.environ.pop("ACCELERATE_USE_FSDP", None)     # an FSDP Accelerator sets it for the process
    args = SFTConfig(output_dir=out, max_steps=steps, per_device_train_batch_size=4,
                     logging_steps=1, report_to=[], save_strategy="no", learning_rate=LR,
                     warmup_steps=0, lr_scheduler_type="constant", disable_tqdm=True, seed=0,
                     data_seed=0, dataloader_num_workers=0, max_length=16, use_cpu=True,
                     fsdp=True, fsdp_config={"version": 2}, **extra)
    model, tok, ds = sft_pieces()
    capture = LogCapture()
    trainer = CompressedSFTTrainer(model=model, args=args, train_dataset=ds,
                                   processing_class=tok, callbacks=[capture],
                                   peft_config=peft_config, comm_compressor=preset,
                                   ranks_per_node=1)
    trainer.train()
    return trainer, capture.logs


def sft_worker(rank: int, world: int, tmp: str) -> dict:
    """``none`` and ``sdp4bit``: losses, logged and metered bytes; then ``hfcompress.apply``
    before the Trainer (must be refused in one message)."""
    setup(rank, world)
    out = {}
    for preset in ("none", "sdp4bit"):
        trainer, logs = sft_train(os.path.join(tmp, preset), preset, steps=8)
        out[preset] = {"losses": losses(trainer), "comm": comm_logs(logs),
                       "meter": meter_steps(trainer),
                       "sharded": type(trainer.model_wrapped).__name__,
                       "trainer": type(trainer).__mro__[1].__name__}
    import hfcompress
    from trl import SFTTrainer

    class CompressedSFTTrainer(hfcompress.CompressionMixin, SFTTrainer):
        pass

    model, tok, ds = sft_pieces()
    hfcompress.apply(model, "sdp4bit", shard=True)
    try:
        CompressedSFTTrainer(model=model, train_dataset=ds, processing_class=tok,
                             comm_compressor="sdp4bit")
        out["applied"] = "no error"
    except ValueError as err:
        out["applied"] = str(err)
    return out


# -- LoRA: frozen base weights under qWD --------------------------------------------------------
#: a LLaMA of realistic proportions for LoRA (LoRA r=8 on q/v is ~0.5% of a layer): hidden
#: 512, 2 layers, 6.4M parameters
LORA_LLAMA = {"vocab_size": 320, "hidden_size": 512, "intermediate_size": 1376,
              "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 8}
LORA_STEPS = 4


def lora_model():
    """The LLaMA with LoRA (r=8, q_proj / v_proj; peft), the same on every rank: the base
    frozen, B initialised non-zero so the adapters matter from step 1."""
    import torch
    from peft import LoraConfig, get_peft_model
    from hfcompress.testing import tiny_llama

    model = get_peft_model(tiny_llama(**LORA_LLAMA),
                           LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(1)
    for n, p in model.named_parameters():
        if "lora_B" in n:
            p.data.normal_(0, 0.02)
    return model


def lora_run(frozen_path: bool, ranks_per_node: int = 1, async_op: bool = False) -> dict:
    """``LORA_STEPS`` AdamW steps of the LoRA model, sharded by ``hfcompress.apply`` with
    sdp4bit (``ranks_per_node=1``: 2 emulated nodes); per step the losses and the wire
    meter's inter-node bytes (all ranks). ``async_op``: asynchronous unshards with explicit
    prefetching of the next layer (FSDP2's ``async_op=True`` all-gathers)."""
    import torch
    import torch.distributed as dist
    import hfcompress
    from hfcompress.integrations import fsdp

    saved = fsdp.frozen_columns
    if not frozen_path:          # today's path: frozen weights' differences sent every step
        fsdp.frozen_columns = lambda *args: None
    try:
        model = lora_model()
        handle = hfcompress.apply(model, "sdp4bit", ranks_per_node=ranks_per_node, shard=True)
    finally:
        fsdp.frozen_columns = saved
    layers = list(model.base_model.model.model.layers)
    if async_op:
        for m in [*layers, model]:          # the root: the PeftModel apply sharded
            m._set_unshard_async_op(True)
        layers[0].set_modules_to_forward_prefetch([layers[1]])
        layers[1].set_modules_to_backward_prefetch([layers[0]])
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    out = {"losses": [], "inter": [], "trainable": sum(p.numel() for p in model.parameters()
                                                       if p.requires_grad),
           "params": sum(p.numel() for p in model.parameters())}
    for step in range(LORA_STEPS):
        if async_op:
            layers[0].unshard(async_op=True)
        g = torch.Generator().manual_seed(100 * step + dist.get_rank())
        ids = torch.randint(0, 320, (2, 32), generator=g)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        handle.step()
        out["losses"].append(loss.detach().clone())
    for s in handle.meter.history:
        t = torch.tensor([float(s["inter_bytes"])], dtype=torch.float64)
        dist.all_reduce(t)
        out["inter"].append(t.item())
    out["losses"] = [x.item() for x in out["losses"]]
    return out


def lora_worker(rank: int, world: int) -> dict:
    import os
    os.environ["HFCOMPRESS_COMPILE"] = "0"
    os.environ.pop("LOCAL_WORLD_SIZE", None)
    return {"frozen": lora_run(True), "today": lora_run(False),
            "frozen_async": lora_run(True, async_op=True)["losses"],
            "frozen_one_node": lora_run(True, ranks_per_node=2)["losses"],
            "today_one_node": lora_run(False, ranks_per_node=2)["losses"]}
