"""transformers / Accelerate private names are reached only in ``hfcompress/trainer/_hf.py``
(as FSDP2's only in ``integrations/_fsdp2.py``, ``test_handle.py``): a grep of the package for
the private attributes of the transformers and Accelerate classes hfcompress touches, for
private names reached through the ``transformers`` / ``accelerate`` modules, and for the
SIGTERM checkpoint's internals the fence patches."""

from __future__ import annotations

import pathlib
import re

import accelerate
import pytest
import torch
import transformers
from accelerate import Accelerator, ParallelismConfig
from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import FullyShardedDataParallelPlugin

from hfcompress.trainer import _hf

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "hfcompress"
FENCE = PACKAGE / "trainer" / "_hf.py"

#: reached outside the trainer, on a model or config handed in, by modules left to their own
#: layer (``integrations`` and ``models`` sit below ``trainer/``, so cannot import the fence):
#: the decoder-layer classes, a config's source path, the tied weights. Each entry must still
#: be there, so the list only shrinks
ELSEWHERE = {"integrations/fsdp.py": {"_no_split_modules"},
             "models.py": {"_name_or_path", "_tied_weights_keys"},
             "eval/harness.py": {"_name_or_path"}}
#: the SIGTERM checkpoint's manager, patched per instance by the fence
PATCHED = {"jit_manager", "execute_jit_checkpoint", "trainer_jit_checkpoint"}


def hf_private_names() -> set[str]:
    """The private (single-underscore) attributes of the transformers and Accelerate classes
    hfcompress touches, less those they inherit from ``object`` / ``torch.nn.Module``."""
    classes = [transformers.Trainer, transformers.TrainingArguments, transformers.TrainerCallback,
               transformers.TrainerState, transformers.PreTrainedModel, Accelerator,
               AcceleratorState, PartialState, FullyShardedDataParallelPlugin, ParallelismConfig]
    names = {n for c in classes for n in dir(c)} | set(vars(transformers.PretrainedConfig()))
    inherited = set(dir(torch.nn.Module)) | set(dir(object))
    return {n for n in names - inherited if n.startswith("_") and not n.startswith("__")}


def uses(path: pathlib.Path, names: set[str], root: pathlib.Path = PACKAGE) -> list[str]:
    """``file:line: name`` for each of ``names`` reached as an attribute, a string, a defined
    method, and each private name reached through ``transformers`` / ``accelerate``."""
    word = re.compile(r"(?:\.|\bdef |[\"'])(" + "|".join(map(re.escape, sorted(names))) + r")\b")
    module = re.compile(r"\b(?:transformers|accelerate)(?:\.\w+)*\.(_\w+)|"
                        r"\bfrom (?:transformers|accelerate)[\w.]* import .*?\b(_\w+)")
    out = []
    for i, line in enumerate(path.read_text().splitlines()):
        for m in [*word.finditer(line), *module.finditer(line)]:
            out.append(f"{path.relative_to(root)}:{i + 1}: {next(g for g in m.groups() if g)}")
    return out


def test_no_private_hf_name_outside_the_fence():
    names = hf_private_names() | PATCHED
    found = [u for p in sorted(PACKAGE.rglob("*.py")) if p != FENCE for u in uses(p, names)]
    allowed = {f"{f}: {n}" for f, ns in ELSEWHERE.items() for n in ns}
    offenders = [u for u in found if re.sub(r":\d+:", ":", u) not in allowed]
    assert not offenders, "\n".join(offenders)
    assert {re.sub(r":\d+:", ":", u) for u in found} == allowed   # the list only shrinks


def test_the_grep_sees_what_it_refuses(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('x = self._get_output_dir(trial=None)\n'
                   'if "_setup_devices" in vars(args):\n'
                   '    def _save_checkpoint(self, model, trial):\n'
                   'from transformers.trainer import _is_peft_model\n'
                   'manager.execute_jit_checkpoint = f\n'
                   'ok = self._nonfinite_losses\n')
    hits = uses(bad, hf_private_names() | PATCHED, tmp_path)
    assert [h.split(":", 1)[1] for h in hits] == [
        "1: _get_output_dir", "2: _setup_devices", "3: _save_checkpoint",
        "4: _is_peft_model", "5: execute_jit_checkpoint"], hits


def test_the_fence_checks_the_installed_transformers():
    _hf.check_internals()
    for owner, attr in _hf.NEEDED:
        assert attr in hf_private_names(), (owner, attr)
    unchecked = [f"{m.__name__} {m.__version__}" for m, checked in (
        (transformers, _hf.CHECKED_TRANSFORMERS), (accelerate, _hf.CHECKED_ACCELERATE))
        if ".".join(m.__version__.split(".")[:2]) not in checked]
    if unchecked:
        pytest.skip(f"{', '.join(unchecked)}: not among the versions _hf.py was checked "
                    f"against; check its names there and add the version")


def test_a_moved_private_name_raises_a_clear_error(monkeypatch):
    monkeypatch.delattr(transformers.Trainer, "_get_output_dir")
    with pytest.raises(_hf.HFInternalsError) as err:
        _hf.check_internals()
    message = str(err.value)
    assert "Trainer._get_output_dir" in message and "checked against 5.17, 5.24" in message
