"""Statistics an analysis may declare, and the evaluation of a declared analysis against the
result files: units filtered as declared, grouped by host (never pooled across CPU models),
the statistic computed per group, and the goal checked on the number it names.

Registered statistics (`statistic = "..."` in a declaration):

  mean         per-unit `metric`; mean ± s.e. over units with a Student-t 95 % interval
  ratio        per-unit `treatment` / `control`; the mean ratio ± s.e. (paired by unit)
  difference   per-unit `treatment` - `control`; the mean difference ± s.e. (paired)
  pooled_rate  per-unit lists of 0/1 outcomes at `metric`, pooled; Wilson 95 % interval
  pooled_loss  per-unit lists of 0/1 outcomes at `control` and `treatment`, aligned: of the
               n items the control got right (pooled over units), the k the treatment got
               wrong; k / n is the performance the treatment lost where there was some to
               lose (a control that did not learn adds few items, not a flattering zero), and
               `bound` the one-sided exact (Clopper-Pearson) 95 % upper bound on it
  pooled_loss_counts  the same from counts, for results that kept no per-item outcomes: k at
               `metric`, n = round(control accuracy at `control` x items at `count`)
  max, min, median  of the per-unit values
  each         one row per unit, labelled by `label_path`
  each_mean    one row per unit, labelled by `label_path`: the mean ± s.e. (Student-t 95 %
               interval) of the numbers at `metric` inside that unit, e.g. one sweep point's
               per-seed values (`metric` ending in '*')
"""

from __future__ import annotations

import dataclasses
import math
import statistics as pystats
from collections.abc import Callable

import numpy as np
from scipy import stats as sp_stats

from sao_jax import stats
from sao_jax.analysis import data, declare
from sao_jax.analysis.declare import OPS, Analysis


@dataclasses.dataclass(frozen=True)
class Estimate:
  """One row a statistic gives: its numbers, the text shown as 'ours', and the per-unit
  values a notebook plots."""

  text: str
  n: int
  estimate: float | None = None
  se: float | None = None
  ci_low: float | None = None
  ci_high: float | None = None
  bound: float | None = None
  values: tuple[float, ...] = ()
  seeds: tuple[int | None, ...] = ()
  label: str = ""
  unit: data.Unit | None = None  # the one unit a per-unit row ('each') is about


@dataclasses.dataclass(frozen=True)
class Statistic:
  fn: Callable[[Analysis, list[data.Unit]], list[Estimate]]
  needs: tuple[str, ...]


def _num(x) -> float | None:
  if isinstance(x, bool):
    return float(x)
  if isinstance(x, int | float) and math.isfinite(float(x)):
    return float(x)
  return None


def value(u: data.Unit, path: str, reduce: str) -> float | None:
  """A unit's one number at `path`: `reduce` folds the values a '*' path expands to (with
  "one", a path must give exactly one number)."""
  xs = [v for v in (_num(x) for x in data.query(u.doc, path)) if v is not None]
  if not xs:
    return None
  if reduce == "one":
    return xs[0] if len(xs) == 1 else None
  return {
    "mean": lambda: float(np.mean(xs)),
    "sum": lambda: float(np.sum(xs)),
    "max": lambda: max(xs),
    "min": lambda: min(xs),
    "median": lambda: float(np.median(xs)),
    "last": lambda: xs[-1],
    "count": lambda: float(len(xs)),
  }[reduce]()


def outcomes(u: data.Unit, path: str) -> list[float] | None:
  """A unit's list of per-item outcomes at `path` (a list of numbers), or None."""
  v = data.query(u.doc, path)
  xs = v[0] if len(v) == 1 and isinstance(v[0], list) else v
  out = [_num(x) for x in xs]
  return out if out and all(x is not None for x in out) else None


def _pm(a: Analysis, s: stats.SeedStats, signed: bool = False) -> str:
  f = a.format
  if s.n == 1:
    return f"{f(s.mean, signed)} (one run)"
  return (
    f"{f(s.mean, signed)} ± {f(s.se)} (95 % CI {f(s.ci_low, signed)} .. {f(s.ci_high, signed)})"
  )


def _seed_estimate(a: Analysis, pairs: list[tuple[data.Unit, float]], text_fn=None) -> Estimate:
  s = stats.seed_stats([v for _, v in pairs])
  nan = lambda x: None if math.isnan(x) else x  # noqa: E731
  return Estimate(
    text=text_fn(s) if text_fn else _pm(a, s),
    n=s.n,
    estimate=nan(s.mean),
    se=nan(s.se),
    ci_low=nan(s.ci_low),
    ci_high=nan(s.ci_high),
    values=tuple(v for _, v in pairs),
    seeds=tuple(u.seed for u, _ in pairs),
  )


def _mean(a: Analysis, us: list[data.Unit]) -> list[Estimate]:
  pairs = [(u, v) for u in us if (v := value(u, a.metric, a.reduce)) is not None]
  return [_seed_estimate(a, pairs)] if pairs else []


def _paired(a: Analysis, us: list[data.Unit], op: str) -> list[Estimate]:
  rows = []
  for u in us:
    c, t = value(u, a.control, a.reduce), value(u, a.treatment, a.reduce)
    if c is not None and t is not None and (op == "-" or c != 0):
      rows.append((u, c, t))
  if not rows:
    return []
  cs = stats.seed_stats([c for _, c, _ in rows])
  ts = stats.seed_stats([t for _, _, t in rows])
  pairs = [(u, t / c if op == "/" else t - c) for u, c, t in rows]
  f = a.format

  def text(s: stats.SeedStats) -> str:
    if op == "/":
      sp = "{:.2f}x" if s.n == 1 else "{:.2f} ± {:.2f}x"
      r = sp.format(s.mean) if s.n == 1 else sp.format(s.mean, s.se)
      return f"{f(cs.mean)} -> {f(ts.mean)} ({r})"
    return f"{f(cs.mean)} -> {f(ts.mean)} ({_pm(a, s, signed=True)})"

  return [_seed_estimate(a, pairs, text)]


def _pooled_rate(a: Analysis, us: list[data.Unit]) -> list[Estimate]:
  per = [(u, o) for u in us if (o := outcomes(u, a.metric)) is not None]
  if not per:
    return []
  k, n = sum(sum(o) for _, o in per), sum(len(o) for _, o in per)
  lo, hi = stats.wilson(k / n, n)
  f = a.format
  return [
    Estimate(
      text=f"{f(k / n)} (95 % CI {f(lo)} .. {f(hi)}), {n} items",
      n=len(per),
      estimate=k / n,
      ci_low=lo,
      ci_high=hi,
      values=tuple(float(np.mean(o)) for _, o in per),
      seeds=tuple(u.seed for u, _ in per),
    )
  ]


def upper_bound(k: int, n: int, confidence: float = 0.95) -> float:
  """One-sided exact (Clopper-Pearson) upper confidence bound on a rate seen k times in n."""
  return 1.0 if k >= n else float(sp_stats.beta.ppf(confidence, k + 1, n - k))


def _pooled_loss(a: Analysis, us: list[data.Unit]) -> list[Estimate]:
  per = []
  for u in us:
    c, t = outcomes(u, a.control), outcomes(u, a.treatment)
    if c is not None and t is not None and len(c) == len(t):
      right = [y for x, y in zip(c, t, strict=True) if x >= 0.5]
      per.append((u, sum(1 for y in right if y < 0.5), len(right)))
  return _loss_estimate(a, per)


def _pooled_loss_counts(a: Analysis, us: list[data.Unit]) -> list[Estimate]:
  per = []
  for u in us:
    k, acc, n = (value(u, p, a.reduce) for p in (a.metric, a.control, a.count))
    if None not in (k, acc, n):
      per.append((u, int(k), round(acc * n)))
  return _loss_estimate(a, per)


def _loss_estimate(a: Analysis, per: list[tuple[data.Unit, int, int]]) -> list[Estimate]:
  per = [p for p in per if p[2]]
  if not per:
    return []
  k, n = sum(x for _, x, _ in per), sum(x for _, _, x in per)
  b = upper_bound(k, n)
  f = a.format
  return [
    Estimate(
      text=f"{k} of {n} lost ({f(k / n)}), one-sided 95 % bound {f(b)}",
      n=len(per),
      estimate=k / n,
      bound=b,
      values=tuple(x / m for _, x, m in per),
      seeds=tuple(u.seed for u, _, _ in per),
    )
  ]


def _order(pick: Callable[[list[float]], float], name: str):
  def fn(a: Analysis, us: list[data.Unit]) -> list[Estimate]:
    pairs = [(u, v) for u in us if (v := value(u, a.metric, a.reduce)) is not None]
    if not pairs:
      return []
    x = pick([v for _, v in pairs])
    return [
      Estimate(
        text=f"{a.format(x)} ({name} of {len(pairs)})",
        n=len(pairs),
        estimate=x,
        values=tuple(v for _, v in pairs),
        seeds=tuple(u.seed for u, _ in pairs),
      )
    ]

  return fn


def _each(a: Analysis, us: list[data.Unit]) -> list[Estimate]:
  out = []
  for u in us:
    v = value(u, a.metric, a.reduce)
    if v is not None:
      label = data.one(u.doc, a.label_path) if a.label_path else u.key or u.seed
      out.append(
        Estimate(a.format(v), 1, estimate=v, values=(v,), seeds=(u.seed,), label=str(label), unit=u)
      )
  return out


def _each_mean(a: Analysis, us: list[data.Unit]) -> list[Estimate]:
  out = []
  for u in us:
    xs = [v for v in (_num(x) for x in data.query(u.doc, a.metric)) if v is not None]
    if xs:
      label = data.one(u.doc, a.label_path) if a.label_path else u.key or u.seed
      e = _seed_estimate(a, [(u, x) for x in xs])
      out.append(dataclasses.replace(e, seeds=(), label=str(label), unit=u))
  return out


STATISTICS: dict[str, Statistic] = {
  "mean": Statistic(_mean, ("metric",)),
  "ratio": Statistic(lambda a, us: _paired(a, us, "/"), ("treatment", "control")),
  "difference": Statistic(lambda a, us: _paired(a, us, "-"), ("treatment", "control")),
  "pooled_rate": Statistic(_pooled_rate, ("metric",)),
  "pooled_loss": Statistic(_pooled_loss, ("treatment", "control")),
  "pooled_loss_counts": Statistic(_pooled_loss_counts, ("metric", "control", "count")),
  "max": Statistic(_order(max, "max"), ("metric",)),
  "min": Statistic(_order(min, "min"), ("metric",)),
  "median": Statistic(_order(pystats.median, "median"), ("metric",)),
  "each": Statistic(_each, ("metric",)),
  "each_mean": Statistic(_each_mean, ("metric",)),
}


def load_claims(directory) -> list[declare.Claim]:
  """The claims under `directory`, each analysis's statistic checked against the registry."""
  return declare.load_claims(directory, {k: s.needs for k, s in STATISTICS.items()})


@dataclasses.dataclass(frozen=True)
class Row:
  """One evaluated row of an analysis: a host group's estimate and what it shows."""

  analysis: Analysis
  estimate: Estimate
  host: str
  status: str  # "met", "not met", "no goal", "no data"
  exploratory: str  # why the row is exploratory ("" for a declared one)
  excluded: tuple[str, ...]  # units left out by the declaration's `where`, with why
  files: tuple[str, ...]
  retrospective: int  # units measured before the analysis was declared
  units: int  # units in the host group

  @property
  def label(self) -> str:
    return self.analysis.label + (f": {self.estimate.label}" if self.estimate.label else "")


def status(a: Analysis, e: Estimate) -> str:
  if a.goal is None:
    return "no goal"
  x = getattr(e, a.goal.on)
  if x is None:
    return f"no {a.goal.on}"
  return "met" if OPS[a.goal.op](x, a.goal.value) else "not met"


def _filter(a: Analysis, us: list[data.Unit]) -> tuple[list[data.Unit], list[str]]:
  kept, excluded = [], []
  for u in us:
    failed = [c for c in a.where if not c.holds(value(u, c.path, a.reduce))]
    if failed:
      why = ", ".join(f"{c.path} {c.op} {c.value} fails" for c in failed)
      excluded.append(f"seed {u.seed} (`{u.file}`): {why}")
    else:
      kept.append(u)
  return kept, excluded


def _rows(a: Analysis, us: list[data.Unit], exploratory: str) -> list[Row]:
  kept, excluded = _filter(a, us)
  groups: dict[str, list[data.Unit]] = {}
  for u in kept:
    groups.setdefault(u.host, []).append(u)
  out = []
  before = lambda us: sum(1 for u in us if u.time is not None and u.time.date() < a.declared)  # noqa: E731
  for h, g in groups.items():
    for e in STATISTICS[a.statistic].fn(a, g):
      about = [e.unit] if e.unit is not None else g
      files = tuple(dict.fromkeys(u.file for u in about))
      out.append(
        Row(a, e, h, status(a, e), exploratory, tuple(excluded), files, before(about), len(about))
      )
  return out


def evaluate(results, a: Analysis) -> list[Row]:
  """The analysis's rows: the declared seeds' units per host, then, where the files hold
  seeds the declaration did not name, the same statistic over all seeds, labelled
  exploratory. No units: one "no data" row that names the command."""
  us = data.units(results, a)
  exploratory = f"exploratory: {a.why}" if a.exploratory else ""
  declared = [u for u in us if a.seeds is None or u.seed in a.seeds]
  out = _rows(a, declared, exploratory)
  for h in dict.fromkeys(u.host for u in us):  # hosts holding seeds the declaration did not name
    group = [u for u in us if u.host == h]
    extra = sorted({str(u.seed) for u in group if u not in declared})
    if extra:
      why = f"exploratory: adds seeds {', '.join(extra)}, not in the declared set"
      out += _rows(a, group, exploratory or why)
  if not out:
    e = Estimate(text=f"no data: run `{a.command}`", n=0)
    out.append(Row(a, e, "-", "no data", exploratory, (), (), 0, 0))
  return out
