"""Result files: the one way an experiment writes what it measured, and a reader reads it.

A result file is a JSON document that says what it is without its file name:

  schema      the layout's version (SCHEMA); `load` upgrades older files to it
  series      a tag naming the experiment series (e.g. "<script>/<task>/<setting>"):
              the runs of one series differ only in their seed and in when they ran
  provenance  `sao_jax.provenance.provenance()`: command, commit, dirty, time, machine with
              the CPU model (read when the file is opened, before the measurement)
  config      the resolved configuration (`config.to_dict`), when the run has one: what a
              run actually used, not a path to a file that may have changed since
  ...         the script's settings, then its own data

A run that measures in parts writes the file after each (`put` / `write(done=...)`:
"complete" false and "done" the last part finished), so a run stopped part-way keeps what it
measured; with `resume=True` the rerun reads the stopped file back (`kept`, `has`), refusing
one of another series, settings or configuration, and records which run it continued
(`resumed_from`). Writes are atomic: a reader or a crash never sees half a file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import tempfile
from collections.abc import Mapping
from typing import Any

import numpy as np

from sao_jax import config as config_lib
from sao_jax.provenance import provenance

# 1: schema, series and the resolved config at the top (before: no schema; `config` was the
# config file's path, or the resolved config, or absent; some files had no provenance block).
SCHEMA = 1

# The checkout this package lies in (`portable_path`).
_CHECKOUT = pathlib.Path(__file__).resolve().parents[1]

# Provenance fields that files written before the provenance block kept at their top level.
_PROVENANCE_KEYS = ("command", "commit", "dirty", "time", "machine")


class ResultFileError(ValueError):
  """A result file that cannot be resumed (another series, settings or configuration)."""


def to_jsonable(x: Any) -> Any:
  """`json.dumps`'s `default`: numpy and JAX scalars and arrays as numbers and lists, paths as
  strings, sets as sorted lists, dataclasses as dicts (what measurements hand back)."""
  if isinstance(x, np.generic):
    return x.item()
  if hasattr(x, "__array__") and hasattr(x, "shape"):  # np.ndarray, jax.Array
    return np.asarray(x).tolist()
  if isinstance(x, pathlib.PurePath):
    return str(x)
  if isinstance(x, (set, frozenset)):
    return sorted(x)
  if dataclasses.is_dataclass(x) and not isinstance(x, type):
    return dataclasses.asdict(x)
  raise TypeError(f"{type(x).__name__} is not JSON serialisable: {x!r}")


def dumps(doc: Mapping) -> str:
  """`doc` as the JSON text a result file holds (indent 2, numpy/JAX values converted)."""
  return json.dumps(doc, indent=2, default=to_jsonable)


def atomic_write(path: str | pathlib.Path, text: str) -> pathlib.Path:
  """Writes `text` at `path` (creating its folder) through a temporary file in the same folder
  and a rename, so the path holds the old file or the new one, never a part of either."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
  try:
    os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide a shared result from other users
    with os.fdopen(fd, "w") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    pathlib.Path(tmp).unlink(missing_ok=True)
    raise
  return path


def config_file_id(path: str) -> str:
  """A config file's path as the checkout names it (`experiments/configs/x.py:variant`),
  wherever the checkout lay: a worktree elsewhere holds the same file."""
  return path[path.rindex("experiments/") :] if "experiments/" in path else path


def portable_path(cfg_path: str) -> str:
  """A config path relative to the checkout when it lies inside it."""
  try:
    return str(pathlib.Path(cfg_path).resolve().relative_to(_CHECKOUT))
  except ValueError:
    return cfg_path


def upgrade(doc: dict) -> dict:
  """A result document of any earlier schema in today's (a new dict; `doc` is not changed):
  a config file's path under `config` moves to `config_file` (as `config_file_id` names it),
  a resolved config is `config_lib.upgrade`d, provenance fields kept at the top level are
  gathered into a `provenance` block, and a file without a series gets `series` None (its
  file name was its only tag)."""
  if doc.get("schema", 0) > SCHEMA:
    raise ResultFileError(f"result schema {doc['schema']} is newer than this code's ({SCHEMA})")
  out = {"schema": SCHEMA, "series": doc.get("series"), **doc}
  out["schema"] = SCHEMA
  cfg = out.get("config")
  if isinstance(cfg, str):
    out.pop("config")
    out.setdefault("config_file", config_file_id(cfg))
  elif isinstance(cfg, dict):
    out["config"] = config_lib.upgrade(cfg)
  if not isinstance(out.get("provenance"), dict):
    top = {k: out[k] for k in _PROVENANCE_KEYS if k in out}
    if "commit" not in top and "git_commit" in out:
      top["commit"] = out["git_commit"]
    out["provenance"] = top  # empty where the file recorded none: readers need not check
  return out


def load(path: str | pathlib.Path) -> dict:
  """The result document at `path`, upgraded to SCHEMA."""
  path = pathlib.Path(path)
  try:
    doc = json.loads(path.read_text())
  except ValueError as e:
    raise ResultFileError(f"{path}: not valid JSON ({e})") from None
  if not isinstance(doc, dict):
    raise ResultFileError(f"{path}: expected a JSON object, got {type(doc).__name__}")
  return upgrade(doc)


def _plain(x: Any) -> Any:
  """`x` as it reads back from JSON (tuples as lists, numpy values as numbers)."""
  return json.loads(json.dumps(x, default=to_jsonable))


class ResultFile:
  """The result file of one run at `path` (None: the document is built but never written,
  for a script run for its printout only).

  series: the experiment series' tag. config: the run's resolved `Config` (or its dict), when
  it has one. settings: the script's settings that decide what it measures (steps, seed,
  overrides...), written at the top level and required equal on resume. resume: read an
  existing file at `path` back (none there: a fresh start), refusing it when its series, its
  settings or its resolved config differ from this run's. argv, devices: `provenance`'s.

  `doc` is the document; the script adds its data to it (`doc[...] = ...`, `update`) and
  writes it with `write` (a part finished) or `finish` (the run complete)."""

  def __init__(
    self,
    path: str | pathlib.Path | None,
    *,
    series: str,
    config: config_lib.Config | Mapping | None = None,
    resume: bool = False,
    argv: list[str] | None = None,
    settings: Mapping | None = None,
    devices: bool = True,
  ):
    self.path = pathlib.Path(path) if path else None
    self.doc: dict = {"schema": SCHEMA, "series": series, "provenance": provenance(argv, devices)}
    if config is not None:
      as_dict = config if isinstance(config, Mapping) else config_lib.to_dict(config)
      self.doc["config"] = config_lib.upgrade(_plain(as_dict))
    self.doc.update(_plain(dict(settings or {})))
    # What a stopped run at `path` measured (resume), else empty.
    self.kept: dict = {}
    if resume and self.path is not None and self.path.exists():
      self.kept = load(self.path)
      self._check_same_run(self.kept, settings or {})
      self.doc["resumed_from"] = {
        "commit": (self.kept.get("provenance") or {}).get("commit"),
        "done": self.kept.get("done"),
        "complete": self.kept.get("complete"),
        "resumed_from": self.kept.get("resumed_from"),  # the run before it, if it resumed one
      }

  def _check_same_run(self, prev: dict, settings: Mapping) -> None:
    here = self.doc
    differ = [k for k in settings if prev.get(k) != here.get(k)]
    # A file written before results carried a series and the resolved config (schema 0) is
    # checked on its settings alone.
    if prev.get("series") is not None and prev["series"] != here["series"]:
      differ.insert(0, "series")
    if "config" in prev and prev["config"] != here.get("config"):
      a, b = prev["config"], here.get("config") or {}
      sections = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
      differ.append(f"config (differs in {sections})")
    if differ:
      said = [
        f"{k}: {prev.get(k)!r} there, {here.get(k)!r} here" if k in here or k in prev else k
        for k in differ
      ]
      raise ResultFileError(
        f"{self.path} was written by another run ({'; '.join(said)}): pass another output "
        "file, or drop the resume to measure again"
      )

  def has(self, part: str) -> bool:
    """Whether the stopped run this one resumes finished `part` (a top-level key)."""
    return part in self.kept

  def update(self, data: Mapping | None = None, **kw) -> ResultFile:
    """Adds the script's data to the document (not written yet)."""
    self.doc.update(data or {}, **kw)
    return self

  def put(self, part: str, value: Any) -> pathlib.Path | None:
    """Sets `part` to `value` and writes the file with `part` as the last part done."""
    self.doc[part] = value
    return self.write(done=part)

  def write(self, data: Mapping | None = None, *, done: str | None = None) -> pathlib.Path | None:
    """Writes the document (with `data` added) as a run still going on: "complete" false and,
    given `done`, "done" naming the last part finished. Returns the path (None: no path)."""
    self.update(data)
    self.doc["complete"] = False
    if done is not None:
      self.doc["done"] = done
    return self._write()

  def finish(self, data: Mapping | None = None) -> pathlib.Path | None:
    """Writes the document (with `data` added) as complete ("done": "all" where the run
    wrote parts). Returns the path (None: no path)."""
    self.update(data)
    self.doc["complete"] = True
    if "done" in self.doc:
      self.doc["done"] = "all"
    return self._write()

  def _write(self) -> pathlib.Path | None:
    return atomic_write(self.path, dumps(self.doc)) if self.path is not None else None
