"""LoCo-wrapped optimizers (LoCo 4.2): AdamW and Adafactor that step LoCo's reset clock."""

from .loco import LoCoAdafactor, LoCoAdamW, LoCoOptimizer, loco_optimizer_class

__all__ = ["LoCoAdafactor", "LoCoAdamW", "LoCoOptimizer", "loco_optimizer_class"]
