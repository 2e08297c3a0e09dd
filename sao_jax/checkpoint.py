"""Orbax snapshots of the learner state plus the resolved config (a checkpoint can rebuild its
own run). Params and the rest of the state are separate items so evaluation restores only
params, onto whatever sharding the caller asks for.

A snapshot is written asynchronously into a temporary folder and renamed when complete, so
a crash mid-write leaves no half snapshot behind (leftover temporaries are cleaned up when
the next manager opens). A complete but corrupt snapshot (damaged files) is detected on
restore: `restore_latest_valid` warns and falls back to the previous one. Damage that still
decodes (a few flipped bytes inside a compressed array file restore silently to other
values) is caught by content checksums: `save` writes the CRC32C of every array's bytes
into `meta`, and every restore recomputes and compares them (`DamagedSnapshot`). Shadow
snapshots carry theirs in a `sums` item. The `meta` item
(JSON) holds the resolved config and the run's stream positions (task sampler state,
journal position, transport offsets, clock), so a resumed run continues where it stopped.

With a bucket (`storage.url`, `sao_jax.storage`), Orbax still writes each snapshot into the
local folder (Orbax 0.12.8 cannot write to S3 itself: its array paths must be absolute local
paths or gs://, and its directory operations need s3fs, whose botocore pins python-dateutil
below the project's version), and a `Mirror` then commits every finished snapshot to the
bucket: its files first, then a marker object listing them with their CRC32C, written last.
A snapshot without its marker does not exist for a reader. The bucket is the record: a
resume replaces the local folder by the bucket's committed snapshots (checked against the
markers) before Orbax opens it, and the run's Kafka offsets are committed only once the
bucket holds the snapshot that covers them.
"""

from __future__ import annotations

import json
import logging
import pathlib
import shutil
import threading
import warnings
from collections.abc import Callable
from typing import Any

import crc32c
import jax
import numpy as np
import orbax.checkpoint as ocp

from sao_jax import config as config_lib
from sao_jax import storage
from sao_jax.learner import TrainState

BEST_METRIC = "val_accuracy"


class DamagedSnapshot(RuntimeError):
  """A snapshot restored, but its arrays differ from the checksums written with it."""


def checksums(tree) -> dict[str, str] | None:
  """Per array of `tree` (keyed by its path): dtype, shape and CRC32C of its bytes. None when
  an array is not fully addressable from this process (a multi-host learner): each process
  would see only its shards, so there is nothing whole to sum."""
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  if any(isinstance(x, jax.Array) and not x.is_fully_addressable for _, x in leaves):
    return None
  out = {}
  for path, x in leaves:
    a = np.ascontiguousarray(jax.device_get(x))
    crc = crc32c.crc32c(a.tobytes())
    out[jax.tree_util.keystr(path)] = f"{a.dtype.str}{list(a.shape)}:{crc:08x}"
  return out


def verify(tree, expected: dict[str, str] | None, what: str) -> None:
  """Raises DamagedSnapshot unless `tree` matches the `checksums` written at save time
  (nothing to compare when the snapshot has none, e.g. one written by older code)."""
  got = checksums(tree) if expected is not None else None
  if got is None:
    return
  bad = sorted(k for k in set(expected) | set(got) if expected.get(k) != got.get(k))
  if bad:
    raise DamagedSnapshot(
      f"{what}: {len(bad)} of {len(expected)} arrays differ from the "
      f"checksums written with the snapshot (e.g. {bad[:3]})"
    )


def manager(
  directory: str | pathlib.Path,
  *,
  every: int = 100,
  keep: int = 3,
  keep_best: bool = True,
  remote: str = "",
) -> ocp.CheckpointManager:
  """Saves every `every` steps (asynchronously); keeps the last `keep` snapshots and, with
  `keep_best`, also the one with the highest `val_accuracy` among those saved with metrics.
  `remote`: a bucket URL that holds the snapshots (`Mirror`); `directory` is then the local
  staging folder, refilled from the bucket first."""
  cm = ocp.checkpoint_managers
  policies = [cm.LatestN(n=keep)]
  if keep_best:
    policies.append(
      cm.BestN(get_metric_fn=lambda m: m[BEST_METRIC], n=1, keep_checkpoints_without_metrics=False)
    )
  options = ocp.CheckpointManagerOptions(
    save_interval_steps=every,
    enable_async_checkpointing=True,
    create=True,
    cleanup_tmp_directories=True,
    preservation_policy=cm.AnyPreservationPolicy(policies),
  )
  mirror = Mirror(directory, remote) if remote else None
  mngr = ocp.CheckpointManager(pathlib.Path(directory).absolute(), options=options)
  return mngr if mirror is None else MirroredManager(mngr, mirror)


def reader(directory: str | pathlib.Path) -> ocp.CheckpointManager:
  """A read-only manager: it neither creates `directory` nor starts the background clean-up
  of unfinished snapshots (a writer's job, which `close()` does not wait for: a process that
  only read and then exited printed that thread's traceback at exit)."""
  if not pathlib.Path(directory).is_dir():
    raise FileNotFoundError(f"no checkpoint directory {directory}")
  options = ocp.CheckpointManagerOptions(read_only=True, create=False, save_interval_steps=0)
  absl = logging.getLogger("absl")  # Orbax warns that the directory is read-only: we asked
  level = absl.level
  absl.setLevel(logging.ERROR)
  try:
    return ocp.CheckpointManager(pathlib.Path(directory).absolute(), options=options)
  finally:
    absl.setLevel(level)


def save(
  mngr: ocp.CheckpointManager,
  state: TrainState,
  cfg: config_lib.Config,
  meta: dict[str, Any] | None = None,
  *,
  force: bool = False,
  metrics: dict[str, float] | None = None,
) -> bool:
  """Snapshot at `state.step` if the manager's interval says so (or `force`)."""
  step = int(jax.device_get(state.step))
  if force and step in mngr.all_steps():
    return False
  if not force and not mngr.should_save(step):
    return False
  rest = _rest(state)
  sums = {"params": checksums(state.params), "rest": checksums(rest)}
  return mngr.save(
    step,
    force=force,
    metrics=metrics,
    args=ocp.args.Composite(
      params=ocp.args.StandardSave(state.params),
      rest=ocp.args.StandardSave(rest),
      meta=ocp.args.JsonSave(
        {"config": config_lib.to_dict(cfg), **(meta or {}), "checksums": sums}
      ),
    ),
  )


def _rest(state: TrainState) -> dict:
  """Everything but params: optimizer, step, RNG, step-size scale, skip counter, and the SAO
  value trackers if any."""
  rest = {
    "step": state.step,
    "opt_state": state.opt_state,
    "rng": jax.random.key_data(state.rng),
    "lr_scale": state.lr_scale,
    "nonfinite": state.nonfinite,
  }
  if state.tracker is not None:
    rest["tracker"] = state.tracker
  return rest


def _abstract(tree):
  return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


def restore_state(
  mngr: ocp.CheckpointManager, like: TrainState, step: int | None = None
) -> tuple[TrainState, dict]:
  """Restores onto the shardings of `like` (an initialised state of the same run)."""
  step = mngr.latest_step() if step is None else step
  out = mngr.restore(
    step,
    args=ocp.args.Composite(
      params=ocp.args.StandardRestore(_abstract(like.params)),
      rest=ocp.args.StandardRestore(_abstract(_rest(like))),
      meta=ocp.args.JsonRestore(),
    ),
  )
  sums = out["meta"].get("checksums", {})
  verify(out["params"], sums.get("params"), f"snapshot step {step} params")
  verify(out["rest"], sums.get("rest"), f"snapshot step {step} optimizer state")
  rest = out["rest"]
  state = like.replace(
    step=rest["step"],
    params=out["params"],
    opt_state=rest["opt_state"],
    rng=jax.random.wrap_key_data(rest["rng"]),
    tracker=rest.get("tracker", like.tracker),
    lr_scale=rest["lr_scale"],
    nonfinite=rest["nonfinite"],
  )
  return state, dict(out["meta"])


def restore_latest_valid(
  mngr: ocp.CheckpointManager, like: TrainState
) -> tuple[TrainState, dict, int, list[int]] | None:
  """The newest snapshot that restores cleanly, newest first: (state, meta, step, skipped).

  A snapshot that fails to restore (truncated or damaged files, unreadable metadata) is
  reported with a warning and skipped; None when there is no readable snapshot at all.
  """
  skipped = []
  for step in sorted(mngr.all_steps(), reverse=True):
    try:
      state, meta = restore_state(mngr, like, step)
      return state, meta, step, skipped
    except Exception as err:  # noqa: BLE001 - any failure to read means: not usable
      skipped.append(step)
      aside = _move_aside(mngr, step)
      warnings.warn(
        f"snapshot step {step} in {mngr.directory} is unreadable "
        f"({type(err).__name__}: {str(err)[:200]}); moved to {aside}; falling "
        "back to an earlier one",
        RuntimeWarning,
        stacklevel=2,
      )
  return None


def _move_aside(mngr: ocp.CheckpointManager, step: int) -> pathlib.Path:
  """Takes a damaged snapshot out of the manager's view (kept for inspection under
  `corrupt/`), so the resumed run saves that step again and no later resume trips on it."""
  import time

  src = pathlib.Path(mngr.directory) / str(step)
  dst = pathlib.Path(mngr.directory).parent / f"{pathlib.Path(mngr.directory).name}-corrupt"
  dst.mkdir(exist_ok=True)
  dst = dst / f"{step}-{time.strftime('%Y%m%d%H%M%S')}"
  src.rename(dst)
  mngr.reload()
  return dst


def read_meta(
  directory: str | pathlib.Path, step: int | None = None, mngr=None
) -> tuple[int, dict]:
  """(step, metadata) of the snapshot at `step` (default: the latest). `mngr`: a manager
  already open on `directory`, used and left open (reading many steps opens one, not one
  each)."""
  own = mngr is None
  mngr = reader(directory) if own else mngr
  try:
    step = mngr.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no complete checkpoint in {directory}")
    meta = mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
  finally:
    if own:
      mngr.close()
  return step, dict(meta)


def restore_params(directory: str | pathlib.Path, like_params, step: int | None = None):
  """Params only, onto the shardings of `like_params`; returns (params, step, meta)."""
  mngr = reader(directory)
  try:
    step = mngr.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no complete checkpoint in {directory}")
    out = mngr.restore(
      step,
      args=ocp.args.Composite(
        params=ocp.args.StandardRestore(_abstract(like_params)), meta=ocp.args.JsonRestore()
      ),
    )
  finally:
    mngr.close()
  verify(
    out["params"],
    out["meta"].get("checksums", {}).get("params"),
    f"snapshot step {step} params in {directory}",
  )
  return out["params"], step, dict(out["meta"])


def restore_params_readable(
  directory: str | pathlib.Path, like_for: Callable[[dict], Any], step: int | None = None
) -> tuple[Any, int, dict, list[int]]:
  """Params of the newest snapshot in `directory` that reads and verifies cleanly, for a
  reader (evaluation, export): (params, step, meta, skipped steps). `like_for(meta)` gives the
  params to restore onto, from a snapshot's metadata (called once per distinct config).

  Like `restore_latest_valid`, a damaged snapshot (unreadable metadata or arrays, checksums
  that differ) is skipped with a warning, newest first; unlike it nothing is moved aside: a
  reader leaves the run's directory as it found it. With `step`, only that snapshot, and its
  damage is an error. Errors of `like_for` itself (a config this code cannot build) are not
  damage and propagate."""
  mngr = reader(directory)
  try:
    steps = [step] if step is not None else sorted(mngr.all_steps(), reverse=True)
    if not steps:
      raise FileNotFoundError(f"no complete checkpoint in {directory}")
    likes: dict[str, Any] = {}
    skipped: list[int] = []
    for s in steps:
      try:
        _, meta = read_meta(directory, s, mngr=mngr)
      except Exception as err:  # noqa: BLE001 - any failure to read means: not usable
        _skip(directory, s, err, step, skipped)
        continue
      key = json.dumps(meta.get("config"), sort_keys=True, default=str)
      if key not in likes:
        likes[key] = like_for(meta)
      try:
        out = mngr.restore(
          s,
          args=ocp.args.Composite(
            params=ocp.args.StandardRestore(_abstract(likes[key])), meta=ocp.args.JsonRestore()
          ),
        )
        verify(
          out["params"],
          out["meta"].get("checksums", {}).get("params"),
          f"snapshot step {s} params in {directory}",
        )
      except Exception as err:  # noqa: BLE001
        _skip(directory, s, err, step, skipped)
        continue
      return out["params"], s, dict(out["meta"]), skipped
    raise DamagedSnapshot(f"no readable snapshot in {directory} (tried steps {skipped})")
  finally:
    mngr.close()


def _skip(directory, s: int, err: Exception, asked: int | None, skipped: list[int]) -> None:
  if asked is not None:
    raise DamagedSnapshot(
      f"snapshot step {s} in {directory} is unreadable ({type(err).__name__}: {str(err)[:200]})"
    ) from err
  skipped.append(s)
  warnings.warn(
    f"snapshot step {s} in {directory} is unreadable ({type(err).__name__}: "
    f"{str(err)[:200]}); reading an earlier one",
    RuntimeWarning,
    stacklevel=3,
  )


class ShadowBank:
  """Historical policy versions (params only) with their validation accuracy, as Orbax
  snapshots under `directory`: the last `keep` plus the best. Used for rollback."""

  def __init__(self, directory: str | pathlib.Path, keep: int, remote: str = ""):
    cm = ocp.checkpoint_managers
    policy = cm.AnyPreservationPolicy(
      [
        cm.LatestN(n=keep),
        cm.BestN(
          get_metric_fn=lambda m: m[BEST_METRIC], n=1, keep_checkpoints_without_metrics=False
        ),
      ]
    )
    options = ocp.CheckpointManagerOptions(
      create=True,
      cleanup_tmp_directories=True,
      enable_async_checkpointing=False,
      preservation_policy=policy,
    )
    mirror = Mirror(directory, remote) if remote else None
    self.mngr = ocp.CheckpointManager(pathlib.Path(directory).absolute(), options=options)
    if mirror is not None:
      self.mngr = MirroredManager(self.mngr, mirror)
    self.scores: dict[int, float] = {}
    self.lineages: dict[int, int] = {}  # step -> policy lineage of that shadow (sao_jax.lineage)

  def reset_to(
    self, step: int, scores: dict[int, float], lineages: dict[int, int] | None = None
  ) -> None:
    """After a resume at `step`: forget shadows taken after it (they are retaken)."""
    for s in self.mngr.all_steps():
      if s > step or s not in scores:
        self.mngr.delete(s)
    self.mngr.wait_until_finished()  # (with a bucket: drops them there too)
    self.scores = {s: v for s, v in scores.items() if s in self.mngr.all_steps()}
    self.lineages = {s: v for s, v in (lineages or {}).items() if s in self.scores}

  def save(self, step: int, params, val_accuracy: float, lineage: int | None = None) -> None:
    if step in self.mngr.all_steps():
      self.mngr.delete(step)
    self.mngr.save(
      step,
      metrics={BEST_METRIC: val_accuracy},
      force=True,
      args=ocp.args.Composite(
        params=ocp.args.StandardSave(params), sums=ocp.args.JsonSave({"params": checksums(params)})
      ),
    )
    self.mngr.wait_until_finished()
    kept = set(self.mngr.all_steps())
    self.scores = {s: v for s, v in {**self.scores, step: val_accuracy}.items() if s in kept}
    if lineage is not None:
      self.lineages[step] = lineage
    self.lineages = {s: v for s, v in self.lineages.items() if s in kept}

  def best(self) -> tuple[int, float] | None:
    if not self.scores:
      return None
    step = max(self.scores, key=lambda s: (self.scores[s], s))
    return step, self.scores[step]

  def restore(self, step: int, like_params):
    """The shadow of `step`, checked against its checksums (DamagedSnapshot)."""
    with_sums = (pathlib.Path(self.mngr.directory) / str(step) / "sums").exists()
    items = dict(params=ocp.args.StandardRestore(_abstract(like_params)))
    if with_sums:
      items["sums"] = ocp.args.JsonRestore()
    out = self.mngr.restore(step, args=ocp.args.Composite(**items))
    if with_sums:
      verify(out["params"], out["sums"].get("params"), f"shadow step {step}")
    return out["params"]

  def restore_best(self, like_params) -> tuple[int, float, Any] | None:
    """(step, validation accuracy, params) of the best shadow that restores intact. A damaged
    one is reported, moved aside (see `restore_latest_valid`) and the next best tried."""
    while (best := self.best()) is not None:
      try:
        return best[0], best[1], self.restore(best[0], like_params)
      except Exception as err:  # noqa: BLE001 - any failure to read means: not usable
        del self.scores[best[0]]
        aside = _move_aside(self.mngr, best[0])
        warnings.warn(
          f"shadow step {best[0]} is unreadable ({type(err).__name__}: "
          f"{str(err)[:200]}); moved to {aside}; trying the next best",
          RuntimeWarning,
          stacklevel=2,
        )
    return None

  def close(self) -> None:
    self.mngr.close()


def checkpoint_dir(path: pathlib.Path) -> pathlib.Path:
  """`path` itself if it holds steps; else the newest phase under path/checkpoints. A path
  that does not exist is a FileNotFoundError (not a directory made for it)."""
  if not path.is_dir():
    raise FileNotFoundError(f"{path}: no such directory (a run's workdir or its checkpoints)")
  if (path / "checkpoints").is_dir():
    for phase in ("rl", "sft"):
      d = path / "checkpoints" / phase
      if d.is_dir() and any(p.name.isdigit() for p in d.iterdir()):
        return d
    raise FileNotFoundError(f"no checkpoints under {path}/checkpoints")
  return path


# Snapshots in a bucket ------------------------------------------------------------------------

_COMMIT = ".commit"  # "<step>.commit": the marker of a committed step, written last


class Mirror:
  """The finished snapshots of the local Orbax folder `local`, committed to the bucket prefix
  `url` (see the module docstring): `push` uploads the steps the bucket lacks and drops the
  ones the folder no longer has; `pull` makes the folder the bucket's committed steps."""

  def __init__(self, local: str | pathlib.Path, url: str):
    if jax.process_count() > 1:
      raise config_lib.ConfigError(
        "storage.url with a learner over several processes is not supported yet: Orbax "
        "writes each host's shards into one shared folder, which a bucket mirror cannot stage"
      )
    self.local, self.store = pathlib.Path(local).absolute(), storage.open_store(url)
    self.pull()

  def committed(self) -> dict[int, dict]:
    """Step -> its marker (the files of that step: size and CRC32C of each)."""
    out = {}
    for name in self.store.list():
      if name.endswith(_COMMIT) and name[: -len(_COMMIT)].isdigit():
        try:
          out[int(name[: -len(_COMMIT)])] = json.loads(self.store.read(name))
        except (FileNotFoundError, json.JSONDecodeError):
          continue  # (dropped meanwhile, or not ours)
    return out

  def local_steps(self) -> set[int]:
    """Steps Orbax finished in the local folder (it renames a step's folder to its number
    once every file is written)."""
    if not self.local.is_dir():
      return set()
    return {int(p.name) for p in self.local.iterdir() if p.is_dir() and p.name.isdigit()}

  def push(self) -> None:
    remote = self.committed()
    for step in sorted(self.local_steps() - set(remote)):
      self._upload(step)
    for step in sorted(set(remote) - self.local_steps()):
      self._drop(step)

  def pull(self) -> list[int]:
    """Replaces the local folder's snapshots by the bucket's committed ones; returns their
    steps. A step whose files do not match its marker is left out, with a warning (the one
    before it is then the newest, as with a damaged local snapshot)."""
    committed = self.committed()
    self.local.mkdir(parents=True, exist_ok=True)
    for p in self.local.iterdir():  # finished steps and temporaries alike: the bucket rules
      if p.is_dir() and (p.name.isdigit() or "orbax-checkpoint-tmp" in p.name):
        shutil.rmtree(p)
    got = []
    for step, marker in sorted(committed.items()):
      tmp = self.local / f"{step}.orbax-checkpoint-tmp-pull"
      try:
        for rel, info in marker["files"].items():
          data = self.store.read(f"{step}/{rel}")
          if len(data) != info["size"] or crc32c.crc32c(data) != info["crc32c"]:
            raise DamagedSnapshot(f"{rel} differs from the size and checksum committed with it")
          (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
          (tmp / rel).write_bytes(data)
      except (DamagedSnapshot, FileNotFoundError, KeyError, TypeError) as err:
        shutil.rmtree(tmp, ignore_errors=True)
        warnings.warn(
          f"snapshot step {step} in {self.store} is unreadable ({type(err).__name__}: "
          f"{str(err)[:200]}); not restored from",
          RuntimeWarning,
          stacklevel=2,
        )
        continue
      tmp.rename(self.local / str(step))
      got.append(step)
    # Objects of steps without a marker: uploads a crash interrupted, or drops it cut short.
    for name in self.store.list():
      head = name.split("/", 1)[0]
      if "/" in name and head.isdigit() and int(head) not in committed:
        self.store.delete(name)
    return got

  def _upload(self, step: int) -> None:
    folder = self.local / str(step)
    files = {}
    try:
      for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        data = path.read_bytes()
        self.store.write(f"{step}/{rel}", data)
        files[rel] = {"size": len(data), "crc32c": crc32c.crc32c(data)}
    except FileNotFoundError:  # Orbax deleted it meanwhile (its preservation policy)
      for rel in files:
        self.store.delete(f"{step}/{rel}")
      return
    self.store.write(f"{step}{_COMMIT}", json.dumps({"step": step, "files": files}).encode())

  def _drop(self, step: int) -> None:
    self.store.delete(f"{step}{_COMMIT}")  # first: from now on the step does not exist
    for name in self.store.list(f"{step}/"):
      self.store.delete(name)


class MirroredManager:
  """An Orbax CheckpointManager whose finished snapshots a `Mirror` commits to a bucket, in a
  background thread. A save counts as in progress until the bucket holds it
  (`is_saving_in_progress`, `wait_until_finished`): callers that act on a finished snapshot
  (committing Kafka offsets) wait for the bucket. Everything else is the manager's."""

  def __init__(self, mngr: ocp.CheckpointManager, mirror: Mirror):
    self._mngr, self.mirror = mngr, mirror
    self._thread: threading.Thread | None = None
    self._error: BaseException | None = None
    self._pushed: set[int] = mirror.local_steps()  # (just pulled: the bucket's)

  def __getattr__(self, name):
    return getattr(self._mngr, name)

  def is_saving_in_progress(self) -> bool:
    if self._mngr.is_saving_in_progress() or self._pushing():
      return True
    if self.mirror.local_steps() != self._pushed:
      self._start_push()
      return True
    return False

  def wait_until_finished(self) -> None:
    self._mngr.wait_until_finished()
    self._join()
    self.mirror.push()
    self._pushed = self.mirror.local_steps()

  def close(self) -> None:
    try:
      self.wait_until_finished()
    finally:
      self._mngr.close()

  def _pushing(self) -> bool:
    if self._thread is not None and not self._thread.is_alive():
      self._join()
    return self._thread is not None

  def _start_push(self) -> None:
    steps = self.mirror.local_steps()

    def push():
      try:
        self.mirror.push()
        self._pushed = steps
      except BaseException as err:  # noqa: BLE001 - raised in the caller's thread
        self._error = err

    self._thread = threading.Thread(target=push, name="snapshot-mirror", daemon=True)
    self._thread.start()

  def _join(self) -> None:
    if self._thread is not None:
      self._thread.join()
      self._thread = None
    if self._error is not None:
      err, self._error = self._error, None
      raise storage.StoreError(f"committing snapshots to {self.mirror.store} failed: {err}")


def snapshot_url(cfg: config_lib.Config, name: str) -> str:
  """The bucket prefix of a phase's snapshots (`checkpoints/<name>`), "" without a bucket."""
  return str(storage.join(cfg.storage.url, "checkpoints", name)) if cfg.storage.url else ""
