"""The checkpoint folder ``train(resume_from_checkpoint=...)`` resumes from.

HF's Trainer writes a checkpoint's files in place, ``trainer_state.json`` last (after the
model, optimizer, scheduler and RNG states; hfcompress writes its compressor state before
all of them). A run stopped while saving leaves a ``checkpoint-N`` folder with files
truncated or missing, and HF's ``True`` (the highest-numbered folder) would resume from it
and fail on a raw read error, or load a truncated file. Here a folder is complete when its
``trainer_state.json`` reads as JSON holding the folder's step: ``True`` (or the string
``"True"`` of ``--resume_from_checkpoint True``) takes the newest complete folder and warns
about newer incomplete ones; a folder given by name that is incomplete is refused, naming it.
"""

from __future__ import annotations

import json
import logging
import os

from transformers.trainer import TRAINER_STATE_NAME as STATE_FILE
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

logger = logging.getLogger(__name__)


def incomplete_reason(folder: str) -> str | None:
    """Why ``folder`` is not a complete checkpoint, or None."""
    path = os.path.join(folder, STATE_FILE)
    try:
        with open(path) as f:
            step = json.load(f).get("global_step")
    except FileNotFoundError:
        return f"it has no {STATE_FILE} (HF writes it last: the run stopped while saving)"
    except (OSError, ValueError, AttributeError) as e:
        return f"its {STATE_FILE} is unreadable ({e}): the run stopped while saving"
    name = os.path.basename(os.path.normpath(folder))
    if name.startswith(f"{PREFIX_CHECKPOINT_DIR}-") and name != f"{PREFIX_CHECKPOINT_DIR}-{step}":
        return f"its {STATE_FILE} is of step {step}"
    return None


def checkpoints_newest_first(output_dir: str) -> list[str]:
    """The ``checkpoint-N`` folders of ``output_dir``, highest N first."""
    if not os.path.isdir(output_dir):
        return []
    steps = []
    for name in os.listdir(output_dir):
        head, _, n = name.partition("-")
        if head == PREFIX_CHECKPOINT_DIR and n.isdigit() \
                and os.path.isdir(os.path.join(output_dir, name)):
            steps.append(int(n))
    return [os.path.join(output_dir, f"{PREFIX_CHECKPOINT_DIR}-{n}")
            for n in sorted(steps, reverse=True)]


def resolve(resume: str | bool | None, output_dir: str) -> str | None:
    """The folder to resume from (None: train from scratch); ValueError saying what to do."""
    if isinstance(resume, str) and not os.path.isdir(resume) \
            and resume.strip().lower() in ("true", "false", "none", ""):
        # --resume_from_checkpoint True arrives as the string "True", not a folder named True
        resume = True if resume.strip().lower() == "true" else None
    if resume is True:
        found = checkpoints_newest_first(output_dir)
        if not found:
            raise ValueError(f"resume_from_checkpoint=True: no checkpoint-* folder in "
                             f"output_dir {output_dir!r} to resume from")
        for folder in found:
            reason = incomplete_reason(folder)
            if reason is None:
                return folder
            logger.warning("hfcompress: not resuming from %s: %s", folder, reason)
        raise ValueError(f"resume_from_checkpoint=True: no complete checkpoint in output_dir "
                         f"{output_dir!r} ({found[0]}: {incomplete_reason(found[0])})")
    if isinstance(resume, str):
        if not os.path.isdir(resume):
            raise ValueError(f"resume_from_checkpoint={resume!r}: no such folder (give a "
                             f"checkpoint-* folder, or True for the last one in output_dir)")
        reason = incomplete_reason(resume)
        if reason is not None:
            raise ValueError(f"resume_from_checkpoint={resume!r} is incomplete: {reason}; give "
                             f"an earlier checkpoint-* folder, or True for the newest complete one")
        return resume
    return None
