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
