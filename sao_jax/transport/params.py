"""Parameter channel: the learner publishes versioned parameters, samplers pick them up.

A policy is named by (lineage, version) (`sao_jax.lineage`): a resumed or rolled-back learner
publishes version numbers that an earlier lineage already used, so files, announcements and
readers carry and compare the pair, and no lineage's file is ever overwritten by another's.
Versions are written as `.npz` files (arrays only, loaded with allow_pickle=False) into a
directory, each by write-to-temp then atomic rename, and announced by rewriting `LATEST`
(JSON: lineage, version, file, CRC32C of the file, and the same for the older versions still
kept) atomically. A directory on shared storage therefore works across machines as it does across
processes; readers never see a half-written file. A file whose bytes changed after it was
written (a storage fault) fails its checksum: the reader reports it once and takes the
newest intact version instead (or keeps the one it has). With the run's key
(`sao_jax.transport.auth`), each announced entry also carries a tag over (lineage, version)
and the file's bytes: a reader holding the key takes no version without a valid one, so
whoever can write the directory but lacks the key cannot hand the samplers a policy.

The directory may also be a bucket prefix (`s3://...`, `gs://...`; `sao_jax.storage`):
there each version is one object PUT (whole or absent, never half) and `LATEST` is put after
it, so the same order gives readers the same guarantee without a shared filesystem.
"""

from __future__ import annotations

import hmac
import io
import json
import os
import warnings
import zipfile

import crc32c
import jax
import numpy as np

from sao_jax import distributed, storage
from sao_jax.transport import auth


def flatten(tree) -> dict[str, np.ndarray]:
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in leaves}


def unflatten(like, flat: dict[str, np.ndarray]):
  paths, treedef = jax.tree_util.tree_flatten_with_path(like)
  missing = [jax.tree_util.keystr(p) for p, _ in paths if jax.tree_util.keystr(p) not in flat]
  if missing:
    raise KeyError(f"published parameters lack {missing[:3]}")
  return jax.tree_util.tree_unflatten(treedef, [flat[jax.tree_util.keystr(p)] for p, _ in paths])


class ParamPublisher:
  """Writes versions into `directory` (a local path or a bucket URL). A learner over several
  processes calls `publish` in every process (the params are gathered from all hosts); only
  process 0 writes."""

  def __init__(self, directory: str | os.PathLike, keep: int = 3, key: bytes | None = None):
    self.store, self.key = storage.open_store(directory), key
    if distributed.is_primary():
      self.store.ensure()
    self.keep = keep
    self._published: list[dict] = []  # {"version", "file", "crc32c"}, oldest first

  def publish(self, version: int, params, lineage: int = -1) -> None:
    flat = flatten(distributed.host_value(params))
    if not distributed.is_primary():
      return
    buf = io.BytesIO()
    np.savez(buf, **flat)
    data = buf.getvalue()
    # (a lineage id is 48 bits: 12 hex digits; -1, no lineage, is written as "none")
    tag = f"{lineage:012x}" if lineage >= 0 else "none"
    name = f"params_{tag}_v{version:08d}.npz"
    self.store.write(name, data)
    entry = {"lineage": lineage, "version": version, "file": name}
    entry["crc32c"] = crc32c.crc32c(data)
    if self.key is not None:
      entry["tag"] = _tag(self.key, entry, data)
    self._published.append(entry)
    # Older files stay a while: a sampler may be reading the previous version right now.
    while len(self._published) > self.keep:
      self.store.delete(self._published.pop(0)["file"])
    announce = dict(self._published[-1], previous=self._published[-2::-1])
    self.store.write("LATEST", json.dumps(announce).encode())  # last: the version is whole


# What reading the announcement may meet: a file already rotated away, a bucket out of reach
# for a moment, a half-written or foreign LATEST.
_UNREADABLE = (
  FileNotFoundError,
  storage.StoreError,
  json.JSONDecodeError,
  KeyError,
  TypeError,
  ValueError,
)


class ParamSubscriber:
  def __init__(self, directory: str | os.PathLike, key: bytes | None = None):
    self.store, self.key = storage.open_store(directory), key
    self.damaged: set[str] = set()  # files that failed their checksum (reported once)

  def poll(self, current: tuple[int, int]) -> tuple[int, int, dict[str, np.ndarray]] | None:
    """(lineage, version, flat arrays) if a policy other than `current` ((lineage, version))
    is announced, else None. Not only newer ones: a learner that resumed from a snapshot, or
    rolled back, announces a new lineage whose version numbers may be older or the same,
    and its samplers must follow it. If the announced file is damaged, the newest intact one
    still kept is taken instead (None if that is `current`)."""
    try:
      latest = json.loads(self.store.read("LATEST"))
      for entry in [latest, *latest.get("previous", [])]:
        if _identity(entry) == tuple(current):
          return None  # the newest intact version is the one the reader has
        got = self._load(entry)
        if got is not None:
          return (*_identity(entry), got)
      return None
    except _UNREADABLE:
      # (announced file already rotated away, or the bucket out of reach for a moment: the
      # next poll sees a newer one)
      return None

  def announced(self) -> tuple[int, int] | None:
    """(lineage, version) announced now, without loading it (None when nothing is)."""
    try:
      return _identity(json.loads(self.store.read("LATEST")))
    except _UNREADABLE:
      return None

  def _load(self, entry: dict) -> dict[str, np.ndarray] | None:
    """The arrays of one announced file, or None (reported once) if its bytes are damaged."""
    name = entry["file"]
    if name in self.damaged:
      return None
    data = self.store.read(name)
    why = None
    if "crc32c" in entry and crc32c.crc32c(data) != entry["crc32c"]:
      why = "checksum mismatch"
    elif self.key is not None and not hmac.compare_digest(
      str(entry.get("tag", "")), _tag(self.key, entry, data)
    ):
      why = "no valid tag under the run's key: not published by this run's learner"
    else:
      try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
          return {k: z[k] for k in z.files}
      except (zipfile.BadZipFile, ValueError, OSError, EOFError) as err:
        why = f"{type(err).__name__}: {err}"
    self.damaged.add(name)
    warnings.warn(
      f"published parameters {self.store.where(name)} are damaged ({why}); using the "
      "newest intact version instead",
      RuntimeWarning,
      stacklevel=3,
    )
    return None


def _tag(key: bytes, entry: dict, data: bytes) -> str:
  """The tag of one published version: over its (lineage, version) and its file's bytes."""
  lineage, version = _identity(entry)
  return auth.tag(key, f"{lineage}:{version}:".encode() + data).hex()


def _identity(entry: dict) -> tuple[int, int]:
  """(lineage, version) of an announcement entry (lineage -1 where it has none)."""
  return int(entry.get("lineage", -1)), int(entry["version"])
