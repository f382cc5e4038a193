"""Compressor state in Trainer checkpoints: one file per rank, ``hfcompress_rank{r}.pt``.

A file holds what the compression handle's ``state_dict()`` returns (LoCo error buffers and
step counters, qWD references, learned levels, RNG streams) plus the settings it was made
with: the preset's ``CompressionConfig``, FSDP2 or DDP, world size, ranks per node, the device
mesh's shape (``{"dp_replicate": 2, "dp_shard": 2}``, ``{"dp_shard": 2, "tp": 2}``; ``{"dp":
world}`` without a ``ParallelismConfig``) and this rank's coordinate in it: the state is of
one (DP, TP) coordinate, so a resume on another mesh shape is refused (naming both). It is
saved with ``torch.save`` and loaded with ``weights_only=True`` (tensors, numbers, strings and
containers; DDP bucket layouts are allow-listed ``Segment`` records).

Resuming with different settings, or from a checkpoint without the files, never loads
anything: ``on_mismatch="error"`` (default) raises ValueError naming what differs;
``"reset"`` warns and starts the compressor state fresh (LoCo errors zero, qWD references
re-initialised by an exact first all-gather of the loaded weights, new RNG streams).

A file also records its rank, the world size, the global step and the sha256 of its
serialized state; loading refuses a file of another rank (swapped files), another step, or
whose bytes changed (a flipped byte, a truncated or empty file), naming the file and what
differs (under ``"reset"``: warns and starts fresh). Every rank reads its file, then the ranks
agree on ONE decision (one ``all_gather_object`` of the problems): all load, or all raise /
reset. Files are written atomically (a temporary file in the same folder, fsync,
``os.replace``); a temporary file a killed write left is never read, and the rank's next save
or load into that folder removes it.

Every file also carries the run's id (``settings["run"]``): drawn on rank 0 when a training
starts without restoring state and broadcast (``new_run_id``), kept by a run that resumes
(``load`` returns the id it restored), so its later checkpoints resume too. Files of several
runs in one checkpoint (two trainings started into one ``output_dir``) are refused, naming
which file is of which run. A save between a step's start and its optimizer step (the step's
collectives have moved the state past the weights) is refused (``step_started``).

A file also carries a fingerprint of the weights it was saved with (``weights_fingerprint``:
a sample of this rank's trainable weights, its FSDP2 / TP shard or DDP's full copy, hashed
at save and again at load, after the Trainer loaded the checkpoint's weights). The rank
files of another run with the same settings and step, placed beside this run's weights,
differ there (the weights of two runs differ in every trained element): refused by name, or
reset under ``"reset"``. Only saves and loads hash; training steps do not.

Format-1 files (no rank, step or checksum), format-2 files (no run id) and format-3 files
(no weights fingerprint) still load, with a warning of what cannot be verified; files
without a mesh shape are of the flat ``{"dp": world}`` mesh.

A job training into an ``output_dir`` keeps a ``hfcompress_job.json`` there (``JobFile``,
rank 0: pid, host, start, a heartbeat a minute, removed at the end of training). A job
that starts while another live job's file is there warns, naming that job; the older job
warns too at its next heartbeat. A file of a job that ended without removing it (its pid is
gone on this host, or no heartbeat for ``STALE_S``) is replaced silently.
"""

from __future__ import annotations

import glob
import hashlib
import io
import json
import logging
import os
import secrets
import socket
import time
import warnings
import weakref
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from ..config import upgrade_dict
from ..integrations.exact_params import Segment

logger = logging.getLogger(__name__)

FORMAT = 4
READABLE = (1, 2, 3, 4)
MISMATCH_CHOICES = ("error", "reset")
#: elements of each weight tensor that the weights' fingerprint hashes
SAMPLE = 64
#: handles whose training step has started and not reached its optimizer step
_mid_step: weakref.WeakSet = weakref.WeakSet()


def state_path(checkpoint_dir: str, rank: int) -> str:
    return os.path.join(checkpoint_dir, f"hfcompress_rank{rank}.pt")


def settings(config_dict: dict[str, Any], kind: str, world_size: int,
             ranks_per_node: int, run: str | None = None, mesh: Any = None) -> dict[str, Any]:
    """What must match between the saving and the resuming run (``mesh``: the device mesh of
    Accelerate's ``ParallelismConfig``, None: the flat world), the id of the run (``run``:
    compared across the ranks' files, not with the resuming run's; set it before saving) and
    this rank's coordinate in the mesh (``coordinate``: informative, the rank fixes it)."""
    shape, coordinate = mesh_layout(mesh, world_size)
    return {"config": config_dict, "integration": kind, "world_size": world_size,
            "ranks_per_node": ranks_per_node, "mesh": shape, "coordinate": coordinate,
            "run": run}


def mesh_layout(mesh: Any, world_size: int) -> tuple[dict[str, int], dict[str, int]]:
    """(dim name -> size, dim name -> this rank's index) of a ``DeviceMesh``; the flat
    ``{"dp": world_size}`` mesh for None."""
    if mesh is None:
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        return {"dp": world_size}, {"dp": rank}
    names = mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(mesh.ndim))
    coordinate = mesh.get_coordinate() or [0] * mesh.ndim
    return ({n: int(s) for n, s in zip(names, mesh.mesh.shape)},
            {n: int(c) for n, c in zip(names, coordinate)})


def _shape(shape: dict[str, int]) -> str:
    return " x ".join(f"{n}={s}" for n, s in shape.items())


def new_run_id() -> str:
    """A random run id drawn on rank 0 and broadcast: the same on every rank (a collective of
    the default group when one is initialised)."""
    run = [secrets.token_hex(8)]
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(run, src=0)
    return run[0]


def step_started(handle: Any) -> None:
    """A training step starts: until ``step_finished`` (its optimizer step) the step's
    collectives move ``handle``'s state past the weights, and ``save`` refuses it."""
    _mid_step.add(handle)


def step_finished(handle: Any) -> None:
    _mid_step.discard(handle)


def mid_step(handle: Any) -> bool:
    """Whether ``handle`` is between ``step_started`` and ``step_finished``."""
    return handle in _mid_step


def weights_fingerprint(model: Any) -> str:
    """sha256 of this rank's trainable weights as they are now (all of them when none
    trains; none for a ``model`` of None): ``SAMPLE`` evenly spaced elements of each
    parameter's local tensor (an FSDP2 / TP shard: this rank's) and its shape and dtype.
    One copy to the host; called at save and load only."""
    params = list(model.parameters()) if model is not None else []
    params = [p for p in params if p.requires_grad] or params
    digest, samples = hashlib.sha256(), []
    for p in params:
        local = p.detach()
        local = local.to_local() if isinstance(local, DTensor) else local
        digest.update(f"{tuple(local.shape)} {local.dtype};".encode())
        flat = local.reshape(-1)
        if flat.numel():
            every = max(1, flat.numel() // SAMPLE)
            samples.append(flat[::every][:SAMPLE].contiguous().view(torch.uint8))
    if samples:
        digest.update(torch.cat(samples).cpu().numpy().tobytes())
    return digest.hexdigest()


def _remove_stale_temporaries(path: str, keep: str | None = None) -> None:
    """Delete the temporary files of ``path`` that a killed write left (all but ``keep``)."""
    for tmp in glob.glob(f"{glob.escape(path)}.tmp*"):
        if tmp != keep:
            try:
                os.remove(tmp)
            except FileNotFoundError:
                pass


def save(handle: Any, setting: dict[str, Any], checkpoint_dir: str, rank: int,
         stats: Any = None, step: int | None = None) -> str:
    """Write this rank's compressor state (and the ``CommStats`` run totals) into
    ``checkpoint_dir`` atomically, with its rank, world size, global ``step``, the run id
    (``setting["run"]``), the fingerprint of the weights of ``handle.model`` and the sha256
    of the serialized state. ValueError, writing nothing, between a step's start and its
    optimizer step (``step_started``)."""
    path = state_path(checkpoint_dir, rank)
    if not setting.get("run"):
        raise ValueError("hfcompress: checkpoint.save needs the run id: pass run=new_run_id() "
                         "(or the id load returned) to checkpoint.settings")
    if mid_step(handle):
        raise ValueError(f"hfcompress: not saving {path}: the checkpoint is taken during a "
                         f"training step, after its collectives moved the compressor state "
                         f"past the weights of step {step} and before its optimizer step, so "
                         f"a resume would not continue this run. Save at a step boundary "
                         f"(on_step_end or on_epoch_end, where save_steps saves; "
                         f"--enable_jit_checkpoint's SIGTERM save waits for the step's end)")
    os.makedirs(checkpoint_dir, exist_ok=True)
    buf = io.BytesIO()
    torch.save({"state": handle.state_dict(),
                "totals": stats.state_dict() if stats is not None else None}, buf)
    body = buf.getvalue()
    record = {"format": FORMAT, "rank": rank, "world_size": setting["world_size"],
              "global_step": step, "settings": setting,
              "weights": weights_fingerprint(getattr(handle, "model", None)),
              "sha256": hashlib.sha256(body).hexdigest(),
              "body": torch.frombuffer(bytearray(body), dtype=torch.uint8)}
    tmp = f"{path}.tmp{os.getpid()}"
    _remove_stale_temporaries(path, keep=tmp)
    try:
        with open(tmp, "wb") as f:
            torch.save(record, f)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.replace(tmp, path)
        except FileNotFoundError:
            raise ValueError(f"hfcompress: {tmp} disappeared while this rank wrote it: another "
                             f"process saves into {checkpoint_dir!r} too (start each training "
                             f"in its own output_dir)") from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def _read(path: str, map_location: Any) -> dict[str, Any]:
    """The file's record; ValueError naming the file if it cannot be read."""
    if os.path.getsize(path) == 0:
        raise ValueError(f"{path} is empty (an interrupted write?)")
    try:
        with torch.serialization.safe_globals([Segment]):
            record = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # truncated, corrupt, not a torch file
        raise ValueError(f"{path} cannot be read ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}): truncated or "
                         f"corrupt") from e
    if not isinstance(record, dict) or not isinstance(record.get("settings"), dict):
        raise ValueError(f"{path} is not an hfcompress compressor-state file")
    return record


def _verify(saved: dict[str, Any], path: str, rank: int, step: int | None,
            map_location: Any) -> tuple[dict[str, Any] | None, str | None]:
    """(the saved ``{"state", "totals"}``, None) or (None, what is wrong with the file)."""
    fmt = saved.get("format") if isinstance(saved, dict) else None
    if fmt not in READABLE:
        raise ValueError(f"{path}: unknown hfcompress state format {fmt!r} (this version "
                         f"reads formats {READABLE})")
    if fmt == 1:
        warnings.warn(f"hfcompress: {path} has the old format 1 (no rank, step or checksum): "
                      f"it cannot be verified; loaded as is", UserWarning, stacklevel=3)
        return {"state": saved["state"], "totals": saved.get("totals")}, None
    if fmt == 2:
        warnings.warn(f"hfcompress: {path} has the old format 2 (no run id): it cannot be "
                      f"checked to be of the same run as the other ranks' files, nor to be "
                      f"saved with these weights; loaded as is", UserWarning, stacklevel=3)
    if fmt == 3:
        warnings.warn(f"hfcompress: {path} has the old format 3 (no weights fingerprint): it "
                      f"cannot be checked to be saved with the weights it resumes beside; "
                      f"loaded as is", UserWarning, stacklevel=3)
    if saved["rank"] != rank:
        return None, (f"{path} holds the state of rank {saved['rank']}, not of rank {rank} "
                      f"(rank files swapped or renamed?)")
    if step is not None and saved["global_step"] != step:
        return None, (f"{path} was saved at global step {saved['global_step']}, but "
                      f"training resumes at step {step} (a file from another checkpoint, or "
                      f"a trainer_state.json of another step?)")
    body = saved["body"].numpy().tobytes()
    digest = hashlib.sha256(body).hexdigest()
    if digest != saved["sha256"]:
        return None, (f"{path}: the state's sha256 is {digest[:16]}..., the file recorded "
                      f"{saved['sha256'][:16]}... (its bytes changed after it was written)")
    with torch.serialization.safe_globals([Segment]):
        return torch.load(io.BytesIO(body), map_location=map_location, weights_only=True), None


def _other_weights(fingerprint: str, path: str, rank: int, model: Any) -> str | None:
    """What is wrong when the weights of ``model`` are not the ones the file was saved with
    (None: they are)."""
    now = weights_fingerprint(model)
    if now == fingerprint:
        return None
    return (f"{path} was saved with other weights than the ones this run resumes with "
            f"(fingerprint of rank {rank}'s weights: {fingerprint[:12]} at the save, {now[:12]} "
            f"as loaded now): it is the compressor state of another run (two trainings saved "
            f"into one output_dir? rank files copied between checkpoints?), and its error "
            f"feedback and references would be applied to weights they do not belong to. "
            f"Resume from a checkpoint that one run wrote whole (weights and rank files)")


def _differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """One line per differing setting (config fields one by one)."""
    def fields(s: dict[str, Any]) -> dict[str, Any]:
        config = upgrade_dict(s.get("config", {}))    # files saved before configs froze
        out = {**{f"config.{k}": v for k, v in config.items()},
               **{k: v for k, v in s.items() if k not in ("config", "mesh")}}
        out.pop("run", None)          # compared across the ranks (_runs)
        out.pop("coordinate", None)   # the rank's, given the mesh and the rank
        return out
    a, b = fields(saved), fields(current)
    missing = "<missing>"
    lines = [f"{k}: checkpoint {a.get(k, missing)!r}, this run {b.get(k, missing)!r}"
             for k in sorted(set(a) | set(b)) if a.get(k, missing) != b.get(k, missing)]
    # files saved before mesh shapes were recorded: the flat mesh of their world
    mesh_a = saved.get("mesh") or {"dp": saved.get("world_size")}
    mesh_b = current.get("mesh") or {"dp": current.get("world_size")}
    if mesh_a != mesh_b:
        lines.append(f"mesh: the checkpoint was saved on the device mesh {_shape(mesh_a)}, this "
                     f"run's mesh is {_shape(mesh_b)} (the compressor state is per (DP, TP) "
                     f"coordinate: resume on the mesh shape it was saved on)")
    return lines


def load(handle: Any, setting: dict[str, Any], checkpoint_dir: str, rank: int,
         on_mismatch: str = "error", map_location: Any = None, stats: Any = None,
         step: int | None = None) -> str | None:
    """Restore this rank's compressor state (and ``stats``' run totals, when saved) from
    ``checkpoint_dir``. Returns the run id of the restored files (the resuming run saves under
    it; files saved before run ids get a new one), None if nothing was restored. ``step``: the
    global step training resumes at (the file must have been saved at it; None: not checked).
    Call it after the checkpoint's weights are loaded into ``handle.model``: the file must
    have been saved with them (``weights_fingerprint``).

    Every rank reads and checks its own file, then the ranks of the default process group
    exchange what they found (and their files' run ids): they all load, or all raise
    (``"error"``) / all start fresh (``"reset"``), with every rank's problem in the message."""
    if on_mismatch not in MISMATCH_CHOICES:
        raise ValueError(f"comm_state_mismatch={on_mismatch!r}; allowed: {MISMATCH_CHOICES}")
    path = state_path(checkpoint_dir, rank)
    _remove_stale_temporaries(path)
    if map_location is not None and torch.device(map_location).type == "cpu":
        map_location = "cpu"     # torch.load does not know Accelerate's "cpu:0"
    saved, problem, run, weights = _check_own(handle, setting, checkpoint_dir, path, rank, step,
                                              map_location)
    found = _gather((problem, run, os.path.basename(path), weights))
    problems = list(dict.fromkeys(p for p, _, _, _ in found if p))   # settings differ alike
    # intact files (their weights are checked next): of one run?
    mixed = _runs(checkpoint_dir, [(r, f) for p, r, f, _ in found if p is None])
    if mixed:
        problems.append(mixed)
    problems += [w for _, _, _, w in found if w]
    if not problems:
        handle.load_state_dict(saved["state"])
        if stats is not None and saved.get("totals"):
            stats.load_state_dict(saved["totals"])
        return run if run is not None else new_run_id()
    problem = "\n".join(problems)
    if on_mismatch == "error":
        raise ValueError(f"hfcompress: {problem}\nResume with the same comm_compressor, "
                         f"ranks_per_node, integration (FSDP2 / DDP), world size and mesh "
                         f"shape from an intact checkpoint, or set comm_state_mismatch='reset' "
                         f"to start the compressor state fresh")
    warnings.warn(f"hfcompress: {problem}\ncomm_state_mismatch='reset': starting the "
                  f"compressor state fresh on every rank (LoCo errors zero, qWD references "
                  f"re-initialised from the loaded weights, new RNG streams)", UserWarning,
                  stacklevel=2)
    return None


def _check_own(handle: Any, setting: dict[str, Any], checkpoint_dir: str, path: str,
               rank: int, step: int | None, map_location: Any) -> tuple:
    """This rank's own file, read and checked: ``(saved, problem, run, weights)``, the
    loaded record (None unless intact), what is wrong with it, its run id and what differs
    from the weights it resumes beside (see :func:`load`)."""
    name = setting["config"].get("name", "custom")
    if not os.path.exists(path):
        return None, (f"checkpoint {checkpoint_dir!r} has no hfcompress compressor state for "
                      f"rank {rank} (saved by a plain Trainer, with comm_compressor=None, or "
                      f"by fewer ranks), but this run uses comm_compressor {name!r}"), None, None
    try:
        record = _read(path, map_location)
        diff = _differences(record["settings"], setting)
        if diff:
            return None, (f"checkpoint {checkpoint_dir!r} was saved with different compression "
                          f"settings than this run's comm_compressor {name!r}:\n  "
                          + "\n  ".join(diff)), None, None
        saved, problem = _verify(record, path, rank, step, map_location)
        run = record["settings"]["run"] if record["format"] >= 3 else None
        weights = None
        if saved is not None and record["format"] >= 4:
            weights = _other_weights(record["weights"], path, rank,
                                     getattr(handle, "model", None))
        return saved, problem, run, weights
    except ValueError as e:
        return None, str(e), None, None


def _runs(checkpoint_dir: str, files: list[tuple[str | None, str]]) -> str | None:
    """What is wrong when the readable ``(run id, file)`` of the ranks are of several runs
    (None: one run)."""
    by_run: dict[str | None, list[str]] = {}
    for run, name in files:
        by_run.setdefault(run, []).append(name)
    if len(by_run) < 2:
        return None
    which = "; ".join(f"run {run or '<none: saved before run ids>'}: {', '.join(names)}"
                      for run, names in by_run.items())
    return (f"checkpoint {checkpoint_dir!r} holds the compressor state of {len(by_run)} "
            f"different runs ({which}): two trainings saved into one output_dir? Its ranks "
            f"would resume on different weights. Resume from a checkpoint that one run wrote "
            f"whole (an earlier checkpoint-N), and start each training in its own output_dir")


def _gather(item: Any) -> list[Any]:
    """Every rank's ``item``, in rank order: one ``all_gather_object`` over the default
    group, so that all ranks take the same decision."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return [item]
    found: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(found, item)
    return found


# -- the job writing an output_dir ------------------------------------------------------------
#: this job's file in ``output_dir`` (rank 0's pid, host, start and last heartbeat)
JOB_FILE = "hfcompress_job.json"
#: seconds between heartbeats; a file without one for ``STALE_S`` is of a job that ended
HEARTBEAT_S, STALE_S = 60.0, 600.0


class JobFile:
    """Rank 0's ``hfcompress_job.json`` in ``output_dir``: ``claim`` at the start of training
    (warning, by name, about another live job's file found there), ``beat`` at step ends
    (a clock read; a rewrite every ``HEARTBEAT_S``, which warns once if another job's file
    replaced this one), ``release`` at the end of training (removes it if it is this job's)."""

    def __init__(self, output_dir: str) -> None:
        self.output_dir, self.path = output_dir, os.path.join(output_dir, JOB_FILE)
        now = time.time()
        self.job = {"pid": os.getpid(), "host": socket.gethostname(), "started": now,
                    "heartbeat": now, "id": secrets.token_hex(8)}
        self.beaten, self.replaced = time.monotonic(), False

    def claim(self) -> None:
        other = self._read()
        if other is not None and _live_other(other):
            logger.warning(f"hfcompress: another job trains into output_dir "
                           f"{self.output_dir!r}: {_describe(other)} ({self.path}). The two "
                           f"save over each other's checkpoints, and a resume may find files "
                           f"of both: stop one of them, or give this job its own output_dir "
                           f"(if that job has ended, delete {self.path})")
        self._write()

    def beat(self) -> None:
        if self.replaced or time.monotonic() - self.beaten < HEARTBEAT_S:
            return
        self.beaten = time.monotonic()
        other = self._read()
        if other is not None and other["id"] != self.job["id"]:
            self.replaced = True
            logger.warning(f"hfcompress: another job started training into output_dir "
                           f"{self.output_dir!r}: {_describe(other)}. The two save over each "
                           f"other's checkpoints, and a resume may find files of both: stop "
                           f"one of them (each training needs its own output_dir)")
            return
        self.job["heartbeat"] = time.time()
        self._write()

    def release(self) -> None:
        other = self._read()
        if other is not None and other["id"] == self.job["id"]:
            os.remove(self.path)

    def _read(self) -> dict | None:
        """The job file's record; None if there is none or it is not one."""
        try:
            with open(self.path) as f:
                record = json.load(f)
        except (OSError, ValueError):
            return None
        fields = {"pid": int, "host": str, "started": (int, float), "heartbeat": (int, float),
                  "id": str}
        if not isinstance(record, dict) or not all(isinstance(record.get(k), t)
                                                   for k, t in fields.items()):
            return None
        return record

    def _write(self) -> None:
        os.makedirs(self.output_dir, exist_ok=True)
        tmp = f"{self.path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(self.job, f)
        os.replace(tmp, self.path)


def _live_other(job: dict) -> bool:
    """Whether a job file is of another process that is alive: a heartbeat within
    ``STALE_S`` and, on this host, its pid running (this process's own file, left by an
    earlier ``train()`` that raised, is not another job's)."""
    if time.time() - job["heartbeat"] > STALE_S:
        return False
    if job["host"] != socket.gethostname():
        return True
    if job["pid"] == os.getpid() or job["pid"] <= 0:
        return False
    try:
        os.kill(job["pid"], 0)
    except ProcessLookupError:
        return False
    except PermissionError:      # alive, another user's
        return True
    return True


def _describe(job: dict) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(job["started"]))
    return (f"pid {job['pid']} on host {job['host']}, started {started}, last heartbeat "
            f"{time.time() - job['heartbeat']:.0f} s ago")
