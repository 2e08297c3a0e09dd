"""Result files as data: load them, find an analysis's units (one seed's record each), and
read what a unit's host and run time were from the provenance the experiment wrote."""

from __future__ import annotations

import dataclasses
import datetime
import json
import pathlib
import re
import subprocess
from typing import Any

from sao_jax.analysis.declare import Analysis

NOT_RECORDED = "CPU not recorded"
SEED_IN_PATH = re.compile(r"(?:^|[/_])seed(\d+)(?:[/_.]|$)")


def load(path: pathlib.Path) -> Any:
  """A result file: a JSON document, or a `.jsonl` file as the list of its lines."""
  text = path.read_text()
  try:
    if path.suffix == ".jsonl":
      return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None


def items(doc: Any, path: str) -> list[tuple[str, Any]]:
  """(where, value) for every value at `path` ('/'-separated keys; '*' expands a list or an
  object's values; an integer indexes a list); `where` is the keys '*' stood for, joined by
  '/'. Missing keys give no value rather than an error: a result written before a metric
  existed simply lacks it."""
  found = [("", doc)]
  for key in (k for k in path.split("/") if k):
    nxt = []
    for at, x in found:
      sub = lambda k, at=at: f"{at}/{k}" if at else str(k)  # noqa: E731
      if key == "*":
        if isinstance(x, dict):
          nxt += [(sub(k), v) for k, v in x.items()]
        elif isinstance(x, list):
          nxt += [(sub(i), v) for i, v in enumerate(x)]
      elif isinstance(x, dict) and key in x:
        nxt.append((at, x[key]))
      elif isinstance(x, list) and key.lstrip("-").isdigit() and -len(x) <= int(key) < len(x):
        nxt.append((at, x[int(key)]))
    found = nxt
  return found


def query(doc: Any, path: str) -> list[Any]:
  """Every value at `path` (see `items`)."""
  return [v for _, v in items(doc, path)]


def one(doc: Any, path: str) -> Any:
  """The single value at `path`, or None where there is none or several."""
  v = query(doc, path)
  return v[0] if len(v) == 1 else None


@dataclasses.dataclass(frozen=True)
class Unit:
  """One seed's record: the file it is in, its document, and its provenance."""

  file: str  # relative to the results directory
  key: str  # which element of the file (the keys the unit path's '*' stood for; "" = file)
  doc: Any
  seed: int | None
  host: str
  time: datetime.datetime | None
  command: str | None
  commit: str | None


def provenance(doc: Any) -> dict:
  """The provenance block a script wrote (at the top or under `provenance`)."""
  if not isinstance(doc, dict):
    return {}
  p = doc.get("provenance")
  return p if isinstance(p, dict) else doc


def host(doc: Any) -> str:
  """The CPU a result was measured on, as a grouping key: model and family/model/stepping
  (two virtual CPUs can share a vague model name). Runs on different CPU models compile
  different float code and run at different speeds: a statistic never pools them."""
  p = provenance(doc)
  c = p["machine"].get("cpu") if isinstance(p.get("machine"), dict) else None
  if c is None and isinstance(doc, dict) and isinstance(doc.get("machine"), dict):
    c = doc["machine"].get("cpu")
  if not isinstance(c, dict) or not c.get("model"):
    return NOT_RECORDED
  fms = c.get("family_model_stepping")
  return f"{c['model']} ({fms})" if fms else c["model"]


def run_time(doc: Any) -> datetime.datetime | None:
  t = provenance(doc).get("time")
  try:
    return datetime.datetime.strptime(t, "%Y-%m-%dT%H:%M:%S%z") if t else None
  except ValueError:
    return None


def files(results: pathlib.Path, patterns: tuple[str, ...]) -> list[pathlib.Path]:
  """The result files an analysis names, in a stable order (each at most once)."""
  out: dict[pathlib.Path, None] = {}
  for pat in patterns:
    for p in sorted(results.glob(pat)):
      if p.is_file():
        out[p] = None
  return list(out)


def units(results: pathlib.Path, a: Analysis) -> list[Unit]:
  """The analysis's units over its files: each file's `unit` path expanded, with the seed
  read at `seed_path` (else the resolved config's seed), and host and time from the file."""
  out = []
  for path in files(results, a.files):
    doc = load(path)
    rel = path.relative_to(results).as_posix()
    for key, u in items(doc, a.unit) if a.unit else [("", doc)]:
      seed = one(u, a.seed_path)
      if seed is None and isinstance(doc, dict):
        seed = one(doc, "config/seed")
      if seed is None and (m := SEED_IN_PATH.search(rel)):
        seed = int(m.group(1))  # a run's metrics.jsonl under .../seed<k>/ records none
      p = provenance(doc)
      out.append(
        Unit(
          file=rel,
          key=key,
          doc=u,
          seed=int(seed) if isinstance(seed, int | float) else None,
          host=host(doc),
          time=run_time(doc),
          command=p.get("command") if isinstance(p.get("command"), str) else None,
          commit=p.get("commit") if isinstance(p.get("commit"), str) else None,
        )
      )
  return out


def committed(results: pathlib.Path) -> set[str] | None:
  """The files under `results` that git tracks (relative to it), or None where `results` is
  not in a git work tree (or git is missing)."""
  try:
    proc = subprocess.run(
      ["git", "ls-files", "-z", "--", "."],
      cwd=results,
      capture_output=True,
      text=True,
      timeout=60,
    )
  except (OSError, subprocess.SubprocessError):
    return None
  if proc.returncode != 0:
    return None
  return {f for f in proc.stdout.split("\0") if f}


def all_result_files(results: pathlib.Path) -> list[str]:
  """Every JSON/JSONL file under `results`, relative to it: the committed ones where
  `results` is in a git work tree, so that a run's workdir left there (or any file not yet
  committed) does not make the listing differ from a clean clone's."""
  found = [
    p.relative_to(results).as_posix()
    for p in results.rglob("*")
    if p.is_file() and p.suffix in (".json", ".jsonl")
  ]
  tracked = committed(results)
  return sorted(f for f in found if tracked is None or f in tracked)
