"""Framework integrations: FSDP2 custom collectives (``apply`` in ``hfcompress.api``)."""

from .ddp import AllReduceState, register_ddp_hook
from .fsdp import FSDPCompression, shard_model
from .hsdp import fully_shard_hsdp, install_hsdp_hook
from .timeouts import CommunicationError

__all__ = ["CommunicationError", "FSDPCompression", "shard_model"]
