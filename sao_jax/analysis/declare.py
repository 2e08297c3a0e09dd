"""Claim declarations: what each analysis of a result series measures and what it must show,
written down (and committed) before its runs. One TOML file per claim under
`experiments/claims/`; this module reads and validates them. It holds no claim, file name,
seed or threshold of its own.

A claim file::

  key = "x"                                   # short id, the section's anchor
  title = "..."
  seed = "..."                                # the source's words
  conditions = "..."                          # how ours is run (optional)
  notebook = "notebooks/claim_x.ipynb"        # optional

  [[analysis]]
  id = "taskA-lost"                           # unique within the claim
  label = "task A: questions lost to the treatment"
  declared = "2026-12-06"                     # when this analysis was fixed (ISO date)
  fixed_in = "commit 1234abcd: ..."           # optional: where the plan was fixed earlier
  primary = true                              # a headline: shown in 'At a glance'
  exploratory = false                         # chosen after results were seen: say so
  why = "..."                                 # required for an exploratory analysis
  files = ["bench_x_taskA_seed*.json"]       # globs under results/
  unit = ""                                   # path to one seed's record in a file ("" = file)
  seed_path = "seed"                          # the unit's seed, relative to the unit
  seeds = [0, 1, 2]                           # the seeds fixed before the runs (optional)
  where = [{ path = "arms/control/accuracy", op = ">=", value = 0.5 }]  # unit filters
  statistic = "pooled_loss"                   # see sao_jax.analysis.estimate.STATISTICS
  metric = "..."                              # or treatment + control, by statistic
  reduce = "mean"                             # how a path with '*' becomes one value per unit
  goal = { op = "<=", value = 0.05, on = "bound" }
  seed_figure = "< 5 %"                       # the source's figure for this row
  format = { spec = "{:.2f}", scale = 100, suffix = " %" }
  command = "python experiments/bench_x.py ..."  # what writes the files

Paths are '/'-separated keys into a JSON document (keys may hold dots); `*` expands every
element of a list or value of an object; an integer indexes a list. A `.jsonl` file is a
list of its lines' objects.
"""

from __future__ import annotations

import dataclasses
import datetime
import pathlib
import tomllib
from collections.abc import Mapping
from typing import Any

OPS = {
  "<": lambda a, b: a < b,
  "<=": lambda a, b: a <= b,
  ">": lambda a, b: a > b,
  ">=": lambda a, b: a >= b,
  "==": lambda a, b: a == b,
  "!=": lambda a, b: a != b,
}
GOAL_ON = ("estimate", "ci_low", "ci_high", "bound")
REDUCE = ("one", "mean", "sum", "max", "min", "median", "last", "count")


class DeclarationError(ValueError):
  """A claim file that does not say what it must, or says something unknown."""


@dataclasses.dataclass(frozen=True)
class Condition:
  """`path op value` on a unit: a unit that fails it is left out of the statistic (and
  counted as such), e.g. a seed whose control did not learn the task."""

  path: str
  op: str
  value: Any

  def holds(self, x: Any) -> bool:
    return x is not None and OPS[self.op](x, self.value)


@dataclasses.dataclass(frozen=True)
class Format:
  spec: str = "{:.3g}"
  scale: float = 1.0
  suffix: str = ""

  def __call__(self, x: float | None, signed: bool = False) -> str:
    if x is None:
      return "-"
    spec = self.spec.replace("{:", "{:+") if signed and "+" not in self.spec else self.spec
    return spec.format(x * self.scale) + self.suffix

  def exact(self, x: float) -> str:
    """A declared number as written (a goal of 6.3x is not '6x')."""
    return f"{x * self.scale:.6g}{self.suffix}"


@dataclasses.dataclass(frozen=True)
class Goal:
  op: str
  value: float
  on: str = "estimate"  # which number of the statistic is compared: GOAL_ON

  def text(self, fmt: Format) -> str:
    return f"{self.on} {self.op} {fmt.exact(self.value)}"


@dataclasses.dataclass(frozen=True)
class Analysis:
  id: str
  label: str
  declared: datetime.date
  files: tuple[str, ...]
  statistic: str
  command: str
  primary: bool = False
  exploratory: bool = False
  why: str = ""
  fixed_in: str = ""
  unit: str = ""
  seed_path: str = "seed"
  seeds: tuple[int, ...] | None = None
  where: tuple[Condition, ...] = ()
  metric: str = ""
  treatment: str = ""
  control: str = ""
  count: str = ""
  label_path: str = ""
  reduce: str = "one"
  goal: Goal | None = None
  seed_figure: str = "-"
  format: Format = Format()
  note: str = ""


@dataclasses.dataclass(frozen=True)
class Claim:
  key: str
  title: str
  seed: str
  analyses: tuple[Analysis, ...]
  conditions: str = ""
  notebook: str = ""
  path: str = ""


_CLAIM_KEYS = {"key", "title", "seed", "conditions", "notebook", "analysis"}
_ANALYSIS_FIELDS = {f.name for f in dataclasses.fields(Analysis)}


def _date(x: Any, where: str) -> datetime.date:
  if isinstance(x, datetime.date):
    return x
  try:
    return datetime.date.fromisoformat(str(x))
  except ValueError:
    raise DeclarationError(f"{where}: declared must be an ISO date, got {x!r}") from None


def _analysis(d: dict, where: str, statistics: Mapping[str, tuple[str, ...]] | None) -> Analysis:
  unknown = set(d) - _ANALYSIS_FIELDS
  if unknown:
    raise DeclarationError(
      f"{where}: unknown key(s) {sorted(unknown)}; known: {sorted(_ANALYSIS_FIELDS)}"
    )
  for k in ("id", "label", "declared", "files", "statistic", "command"):
    if k not in d:
      raise DeclarationError(f"{where}: missing {k!r}")
  d = dict(d)
  where = f"{where} ({d['id']})"
  d["declared"] = _date(d["declared"], where)
  d["files"] = tuple(d["files"]) if isinstance(d["files"], list) else (d["files"],)
  if d.get("seeds") is not None:
    d["seeds"] = tuple(int(s) for s in d["seeds"])
  try:
    d["where"] = tuple(Condition(**c) for c in d.get("where", ()))
    if "goal" in d:
      d["goal"] = Goal(**d["goal"])
    if "format" in d:
      d["format"] = Format(**d["format"])
  except TypeError as e:
    raise DeclarationError(f"{where}: {e}") from None
  a = Analysis(**d)
  if statistics is not None and a.statistic not in statistics:
    raise DeclarationError(f"{where}: unknown statistic {a.statistic!r}; known: {list(statistics)}")
  missing = [k for k in (statistics or {}).get(a.statistic, ()) if not getattr(a, k)]
  if missing:
    raise DeclarationError(f"{where}: statistic {a.statistic!r} needs {missing}")
  if a.reduce not in REDUCE:
    raise DeclarationError(f"{where}: reduce must be one of {REDUCE}, got {a.reduce!r}")
  for c in a.where:
    if c.op not in OPS:
      raise DeclarationError(f"{where}: where-op must be one of {list(OPS)}, got {c.op!r}")
  if a.goal is not None and (a.goal.op not in OPS or a.goal.on not in GOAL_ON):
    raise DeclarationError(f"{where}: goal op in {list(OPS)}, on in {GOAL_ON}; got {a.goal}")
  if a.exploratory and not a.why:
    raise DeclarationError(f"{where}: an exploratory analysis must say why (key 'why')")
  if a.exploratory and a.primary:
    raise DeclarationError(f"{where}: an exploratory analysis cannot be primary")
  return a


def load_claim(
  path: str | pathlib.Path, statistics: Mapping[str, tuple[str, ...]] | None = None
) -> Claim:
  """One claim file, validated: unknown keys, missing fields, duplicate analysis ids and,
  given `statistics` (each registered statistic's name and the fields it needs), unknown
  statistics and missing fields are errors that name the file."""
  path = pathlib.Path(path)
  try:
    d = tomllib.loads(path.read_text())
  except tomllib.TOMLDecodeError as e:
    raise DeclarationError(f"{path}: not valid TOML ({e})") from None
  unknown = set(d) - _CLAIM_KEYS
  if unknown:
    raise DeclarationError(
      f"{path}: unknown key(s) {sorted(unknown)}; known: {sorted(_CLAIM_KEYS)}"
    )
  for k in ("key", "title", "seed"):
    if k not in d:
      raise DeclarationError(f"{path}: missing {k!r}")
  analyses = tuple(_analysis(a, str(path), statistics) for a in d.get("analysis", ()))
  ids = [a.id for a in analyses]
  dup = {i for i in ids if ids.count(i) > 1}
  if dup:
    raise DeclarationError(f"{path}: analysis ids used twice: {sorted(dup)}")
  return Claim(
    key=d["key"],
    title=d["title"],
    seed=d["seed"],
    analyses=analyses,
    conditions=d.get("conditions", ""),
    notebook=d.get("notebook", ""),
    path=path.name,
  )


def load_claims(
  directory: str | pathlib.Path, statistics: Mapping[str, tuple[str, ...]] | None = None
) -> list[Claim]:
  """Every `*.toml` claim under `directory`, ordered by key."""
  paths = sorted(pathlib.Path(directory).glob("*.toml"))
  claims = [load_claim(p, statistics) for p in paths]
  keys = [c.key for c in claims]
  dup = {k for k in keys if keys.count(k) > 1}
  if dup:
    raise DeclarationError(f"{directory}: claim keys used twice: {sorted(dup)}")
  return sorted(claims, key=lambda c: c.key)
