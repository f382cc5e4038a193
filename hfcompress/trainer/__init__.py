"""``hfcompress.Trainer`` / ``hfcompress.TrainingArguments``: Hugging Face's Trainer with
compressed communication (``trainer.py``), the same for any Trainer subclass
(``CompressionMixin``, ``mixin.py``); the callback that installs it and owns what was
installed (``callback.py``, ``install.py``), the communication logs (``metrics.py``), the
compressor state in checkpoints (``checkpoint.py``), distributed runs on CPU-only machines
(``accelerate_cpu.py``); every private transformers / Accelerate name it reaches
(``_hf.py``)."""

from .mixin import CompressionMixin
from .trainer import Trainer, TrainingArguments, warn_single_process

__all__ = ["CompressionMixin", "Trainer", "TrainingArguments", "warn_single_process"]
