"""Parameter channel: the learner publishes versioned parameters, samplers pick them up.

Versions are written as `.npz` files (arrays only, loaded with allow_pickle=False) into a
directory, each by write-to-temp then atomic rename, and announced by rewriting `LATEST`
(JSON: version, file) atomically. A directory on shared storage therefore works across
machines as it does across processes; readers never see a half-written file.
"""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import tempfile

import jax
import numpy as np

from sao_jax import distributed


def flatten(tree) -> dict[str, np.ndarray]:
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in leaves}


def unflatten(like, flat: dict[str, np.ndarray]):
  paths, treedef = jax.tree_util.tree_flatten_with_path(like)
  missing = [jax.tree_util.keystr(p) for p, _ in paths if jax.tree_util.keystr(p) not in flat]
  if missing:
    raise KeyError(f"published parameters lack {missing[:3]}")
  return jax.tree_util.tree_unflatten(treedef, [flat[jax.tree_util.keystr(p)] for p, _ in paths])


def _atomic_write(path: pathlib.Path, write):
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
  try:
    with os.fdopen(fd, "wb") as f:
      write(f)
    os.replace(tmp, path)
  except BaseException:
    # (an interrupt may land after the rename: then there is nothing left to remove)
    with contextlib.suppress(FileNotFoundError):
      os.unlink(tmp)
    raise


class ParamPublisher:
  """Writes versions into `directory`. A learner over several processes calls `publish` in
  every process (the params are gathered from all hosts); only process 0 writes."""

  def __init__(self, directory: str | pathlib.Path, keep: int = 3):
    self.dir = pathlib.Path(directory)
    if distributed.is_primary():
      self.dir.mkdir(parents=True, exist_ok=True)
    self.keep = keep
    self._published: list[pathlib.Path] = []

  def publish(self, version: int, params) -> None:
    flat = flatten(distributed.host_value(params))
    if not distributed.is_primary():
      return
    path = self.dir / f"params_v{version:08d}.npz"
    _atomic_write(path, lambda f: np.savez(f, **flat))
    _atomic_write(self.dir / "LATEST",
                  lambda f: f.write(json.dumps({"version": version, "file": path.name}).encode()))
    self._published.append(path)
    # Older files stay a while: a sampler may be reading the previous version right now.
    while len(self._published) > self.keep:
      self._published.pop(0).unlink(missing_ok=True)


class ParamSubscriber:
  def __init__(self, directory: str | pathlib.Path):
    self.dir = pathlib.Path(directory)

  def poll(self, current: int) -> tuple[int, dict[str, np.ndarray]] | None:
    """(version, flat arrays) if a version other than `current` is announced, else None.
    Not only newer ones: a learner that resumed from a snapshot, or rolled back, announces
    an older version, and its samplers must follow it."""
    try:
      latest = json.loads((self.dir / "LATEST").read_text())
      if int(latest["version"]) == current:
        return None
      with np.load(self.dir / latest["file"], allow_pickle=False) as z:
        return int(latest["version"]), {k: z[k] for k in z.files}
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
      return None  # announced file already rotated away: the next poll sees a newer one
