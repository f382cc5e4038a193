"""``comm_compressor="auto"``: choose each collective's compression from the measured links
and compute (``probe.py``, ``cost_model.py``, ``choose.py``), among the schemes the loss
benchmarks keep within 1% of exact (``candidates.py``), re-probing if asked
(``controller.py``). Entry point: ``hfcompress.apply(model, "auto")``."""

from .candidates import OPTIONS, PIN_ENV, Plan, candidates, parse_pins
from .choose import Choice, choose_ddp, choose_fsdp
from .controller import AutoController

__all__ = ["AutoController", "Choice", "OPTIONS", "PIN_ENV", "Plan", "candidates",
           "choose_ddp", "choose_fsdp", "parse_pins"]
