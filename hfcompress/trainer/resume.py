"""Resuming: the checkpoint ``train(resume_from_checkpoint=...)`` resumes from, and the lines a
re-run and an interrupted run print.

Without compressor state to restore (``comm_compressor`` unset, or one process) the Trainer
resumes exactly as transformers' does: ``resume_from_checkpoint`` is passed on as given. With
it, ``True`` differs in one way: HF writes a checkpoint's files in place, ``trainer_state.json``
last (hfcompress writes its compressor state before all of them), so a run stopped while
saving leaves a newest ``checkpoint-N`` without a readable ``trainer_state.json``, which HF's
``True`` takes and fails on (a raw read error, or a truncated file loaded). Here ``True``
takes the newest folder whose ``trainer_state.json`` reads, warning about each newer one;
HF's errors are the start of ours. A folder given by name is HF's to load; its compressor
state must be of the step training resumes at (``checkpoint.load``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import traceback
from typing import Any

from transformers.trainer import TRAINER_STATE_NAME as STATE_FILE
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

logger = logging.getLogger(__name__)

#: the folder names HF's ``get_last_checkpoint`` picks from
CHECKPOINT_NAME = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}\-(\d+)$")


def state_problem(folder: str) -> str | None:
    """Why ``folder``'s ``trainer_state.json`` cannot be read (None: it can)."""
    try:
        with open(os.path.join(folder, STATE_FILE)) as f:
            json.load(f)
    except FileNotFoundError:
        return f"it has no {STATE_FILE} (HF writes it last: the run stopped while saving)"
    except (OSError, ValueError) as e:
        return f"its {STATE_FILE} is unreadable ({e}): the run stopped while saving"
    return None


def checkpoints_newest_first(output_dir: str) -> list[str]:
    """The folders HF's ``get_last_checkpoint`` chooses from, highest step first (like it,
    FileNotFoundError if ``output_dir`` does not exist)."""
    found = [(int(m.group(1)), name) for name in os.listdir(output_dir)
             if (m := CHECKPOINT_NAME.search(name)) and os.path.isdir(os.path.join(output_dir,
                                                                                    name))]
    return [os.path.join(output_dir, name) for _, name in sorted(found, reverse=True)]


def resolve(resume: Any, output_dir: str) -> str | None:
    """``resume_from_checkpoint`` where compressor state is restored: the folder (as a str),
    or None to train from scratch; HF's ValueError when ``True`` finds no checkpoint."""
    if resume is None or resume is False:
        return None
    if resume is not True:
        return os.fspath(resume)
    found = checkpoints_newest_first(output_dir)
    for folder in found:
        problem = state_problem(folder)
        if problem is None:
            return folder
        logger.warning("hfcompress: not resuming from %s: %s", folder, problem)
    message = f"No valid checkpoint found in output directory ({output_dir})"
    if found:
        message += (f": none has a readable {STATE_FILE} (the newest, {found[0]}: "
                    f"{state_problem(found[0])})")
    raise ValueError(message)


def command_line(resume: Any, output_dir: str | None = None) -> Any:
    """``resume_from_checkpoint`` as HF's example scripts take it from the command line
    (``TrainingArguments.resume_from_checkpoint`` is a str), unless a folder of that name
    exists: ``"True"``: the newest checkpoint of ``output_dir`` (``True``: none is an error,
    as HF's); ``"latest"``: the same, but a run without any checkpoint yet starts from step 0
    (one command for the first launch and every restart, as HF's scripts resume); ``"False"``
    none. Anything else as given."""
    if isinstance(resume, str) and not os.path.isdir(resume):
        word = resume.strip().lower()
        if word == "true":
            return True
        if word == "latest":
            if output_dir is not None and not (os.path.isdir(output_dir) and
                                               checkpoints_newest_first(output_dir)):
                if int(os.environ.get("RANK", "0")) == 0:
                    logger.warning(f"hfcompress: --resume_from_checkpoint latest: no checkpoint "
                                   f"in {output_dir!r} yet, training starts from step 0")
                return None
            return True
        if word in ("false", "none", ""):
            return None
    return resume


def newest(output_dir: str) -> str | None:
    """The checkpoint HF's ``True`` would resume from, None if there is none."""
    return get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None


def rerun_notice(output_dir: str) -> str | None:
    """The line for a run started without ``resume_from_checkpoint`` into an ``output_dir``
    that has checkpoints (None: it has none)."""
    last = newest(output_dir)
    if last is None:
        return None
    return (f"hfcompress: output_dir {output_dir!r} already has checkpoints (newest: {last}); "
            f"this run starts from step 0 and saves over them. To continue from the newest "
            f"instead: --resume_from_checkpoint {last}, or "
            f"trainer.train(resume_from_checkpoint=True)")


def report_interrupt(error: KeyboardInterrupt, rank: int, step: int, output_dir: str) -> None:
    """One line for this rank in place of the traceback of ``error`` (Ctrl-C reaches every
    rank of a launch): where it stopped and, on rank 0, how to resume. The exception still
    propagates (``except KeyboardInterrupt`` works; the process ends as Python's do, by
    SIGINT); only its printing is replaced (``sys.excepthook``)."""
    frame = traceback.extract_tb(error.__traceback__)[-1:]
    where = f" (in {frame[0].name}, {frame[0].filename}:{frame[0].lineno})" if frame else ""
    line = f"hfcompress: rank {rank}: training interrupted at step {step}{where}"
    if rank == 0:
        last = newest(output_dir)
        line += (f"; to continue: --resume_from_checkpoint {last}" if last is not None
                 else "; no checkpoint was saved")
    logger.warning(line)
    error.hfcompress_reported = True
    if getattr(sys.excepthook, "hfcompress_quiet", False):
        return
    previous = sys.excepthook

    def quiet(kind, value, tb):
        if not getattr(value, "hfcompress_reported", False):
            previous(kind, value, tb)

    quiet.hfcompress_quiet = True
    sys.excepthook = quiet
