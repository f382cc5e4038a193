"""Every private transformers / Accelerate name the Trainer integration relies on, in one place
(as ``integrations/_fsdp2.py`` is for FSDP2's).

The Trainer's public API has no hook for what hfcompress must do around three of its steps:
create a CPU launch's process group before ``TrainingArguments`` sets up the devices
(``_setup_devices``), save the compressor state before a checkpoint's files
(``_save_checkpoint``, in ``_get_output_dir``), and hold transformers' SIGTERM checkpoint
(``--enable_jit_checkpoint``) to a step boundary (its ``CheckpointManager``, patched per
instance). No other hfcompress module names them (a test greps the package). Checked against
transformers ``CHECKED_TRANSFORMERS`` and Accelerate ``CHECKED_ACCELERATE``; an accessor that
finds a name gone raises :class:`HFInternalsError` saying so, instead of an
``AttributeError`` deep inside training.
"""

from __future__ import annotations

import os
from functools import cached_property
from typing import Any, Callable

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

try:
    from transformers.trainer_jit_checkpoint import JITCheckpointCallback
except ImportError:            # a transformers without --enable_jit_checkpoint
    JITCheckpointCallback = None

#: transformers releases whose private Trainer names this module was checked against (5.17:
#: the GPU image's, by benchmarks/compat_venv.sh's Trainer tests)
CHECKED_TRANSFORMERS = ("5.17", "5.24")
#: Accelerate releases checked (this module reaches no Accelerate private name today)
CHECKED_ACCELERATE = ("1.15",)


class HFInternalsError(ImportError):
    """The installed transformers moved a private name hfcompress relies on (an
    ``ImportError``, as ``_fsdp2.FSDP2InternalsError``)."""


#: the private methods the hooks below override or call, on the classes that have them
NEEDED = (("Trainer", "_save_checkpoint"), ("Trainer", "_get_output_dir"),
          ("TrainingArguments", "_setup_devices"))


def _get(obj: Any, attr: str) -> Any:
    try:
        return getattr(obj, attr)
    except AttributeError:
        import transformers
        owner = obj.__name__ if isinstance(obj, type) else type(obj).__name__
        raise HFInternalsError(
            f"hfcompress's Trainer integration needs {owner}.{attr}, which transformers "
            f"{transformers.__version__} does not have (checked against "
            f"{', '.join(CHECKED_TRANSFORMERS)}): install one of those, or an hfcompress "
            f"release that supports it") from None


def check_internals() -> None:
    """HFInternalsError naming the first of :data:`NEEDED` this transformers lacks (the
    Trainer calls it when created with a ``comm_compressor``)."""
    import transformers
    for owner, attr in NEEDED:
        _get(getattr(transformers, owner), attr)


def devices_set_up(args: Any) -> bool:
    """Whether ``args`` (any ``TrainingArguments``) already set up its devices (its cached
    ``_setup_devices``)."""
    return "_setup_devices" in vars(args)


class ArgsHooks:
    """Base of a ``TrainingArguments`` subclass: ``before_device_setup()`` (the subclass's)
    runs before the parent's ``_setup_devices``."""

    def before_device_setup(self) -> None:
        """Override: what to do before Accelerate sets up the devices."""

    @cached_property
    def _setup_devices(self):
        self.before_device_setup()
        # super(), not _get: an AttributeError raised inside the set-up is no moved name
        return super()._setup_devices


def checkpoint_folder(trainer: Any, trial: Any) -> str:
    """The folder the Trainer's next checkpoint goes to (``_get_output_dir``)."""
    out = _get(trainer, "_get_output_dir")(trial=trial)
    return os.path.join(out, f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.global_step}")


class TrainerHooks:
    """Base of a ``Trainer`` subclass: ``before_checkpoint(trial)`` (the subclass's) runs
    before the parent's ``_save_checkpoint`` writes the checkpoint's files (into
    :func:`checkpoint_folder`)."""

    def before_checkpoint(self, trial: Any) -> None:
        """Override: what to save before the Trainer's own files."""

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        self.before_checkpoint(trial)
        _get(super(), "_save_checkpoint")(model, trial)


def defer_jit_checkpoint(trainer: Any, wait: Callable[[], bool],
                         waiting: Callable[[], None]) -> None:
    """Patch the SIGTERM checkpoint of ``trainer`` (its ``JITCheckpointCallback``'s manager,
    once): while ``wait()`` is true, skip the save (the request stays standing, so a later
    hook saves) and call ``waiting()``."""
    if JITCheckpointCallback is None:
        return
    for cb in trainer.callback_handler.callbacks:
        manager = _get(cb, "jit_manager") if isinstance(cb, JITCheckpointCallback) else None
        if manager is None or "execute_jit_checkpoint" in vars(manager):   # patched already
            continue
        execute = _get(manager, "execute_jit_checkpoint")

        def at_step_boundary(execute: Callable[[], None] = execute) -> None:
            if not wait():
                execute()
            else:
                waiting()

        manager.execute_jit_checkpoint = at_step_boundary
