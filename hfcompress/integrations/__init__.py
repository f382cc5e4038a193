"""Framework integrations: FSDP2 custom collectives, the DDP comm hook, the HSDP replica hook,
and the one handle ``hfcompress.apply`` returns for all three (``Compression``)."""

from .ddp import AllReduceState, register_ddp_hook
from .fsdp import shard_model
from .handle import Compression
from .hsdp import fully_shard_hsdp, install_hsdp_hook
from .timeouts import CommunicationError

__all__ = ["AllReduceState", "Compression", "CommunicationError", "fully_shard_hsdp",
           "install_hsdp_hook", "register_ddp_hook", "shard_model"]
