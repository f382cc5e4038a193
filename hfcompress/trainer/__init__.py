"""``hfcompress.Trainer`` / ``hfcompress.TrainingArguments``: Hugging Face's Trainer with
compressed communication (``trainer.py``); the callback that installs it and owns what was
installed (``callback.py``, ``install.py``), the communication logs (``metrics.py``), the
compressor state in checkpoints (``checkpoint.py``), distributed runs on CPU-only machines
(``accelerate_cpu.py``)."""

from .trainer import Trainer, TrainingArguments, warn_single_process

__all__ = ["Trainer", "TrainingArguments", "warn_single_process"]
