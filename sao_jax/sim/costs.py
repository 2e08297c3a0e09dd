"""Measured costs that drive the cluster simulator, and the scenario it simulates.

`Costs` holds what one machine (or a scaled projection of it) takes for each piece of work:
decode seconds per token step as a function of the rows in the compiled call, prefill,
learner update per batch, weight publish/load, transport, the trajectory-length samples,
and how co-located processes slow each other. `experiments/calibrate_sim.py` measures them
and writes them as JSON (`Costs.to_dict` / `Costs.from_dict`).

`Scenario` is the policy and the cluster shape: synchronous GRPO, SAO with today's sampler
(a call runs until its longest row ends) or with continuous batching, optional in-flight
weight updates, sampler count, slots, batch, staleness bound, sync interval, horizon.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from sao_jax.config import ConfigError

Points = tuple[tuple[float, float], ...]  # (rows, seconds), sorted by rows

POLICIES = ("grpo", "sao_batch", "sao_continuous")


def _check(ok: bool, msg: str):
  if not ok:
    raise ConfigError(msg)


def _points(raw, name: str) -> Points:
  """(rows, seconds) pairs from a {rows: seconds} mapping or a list of pairs."""
  items = raw.items() if isinstance(raw, Mapping) else raw
  try:
    pts = tuple(sorted((float(r), float(s)) for r, s in items))
  except (TypeError, ValueError):
    raise ConfigError(
      f"{name}: expected {{rows: seconds}} or [[rows, seconds], ...], got {raw!r}"[:200]
    ) from None
  _check(len(pts) >= 1, f"{name}: needs at least one (rows, seconds) point")
  _check(all(r > 0 and s >= 0 for r, s in pts), f"{name}: rows must be > 0 and seconds >= 0")
  _check(len({r for r, _ in pts}) == len(pts), f"{name}: rows measured twice")
  return pts


def interp(points: Points, rows: float) -> float:
  """Seconds at `rows`: piecewise linear through the points; outside them, the end
  segment's line (a single point scales proportionally), never below zero."""
  xs = np.array([p[0] for p in points])
  ys = np.array([p[1] for p in points])
  if len(xs) == 1:
    return float(ys[0] * rows / xs[0])
  if rows <= xs[0]:
    i = 0
  elif rows >= xs[-1]:
    i = len(xs) - 2
  else:
    return float(np.interp(rows, xs, ys))
  slope = (ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i])
  return float(max(0.0, ys[i] + slope * (rows - xs[i])))


@dataclasses.dataclass(frozen=True)
class Profile:
  """How one sampling process spends time (a process configuration: threads, device).

  A call over B compiled rows that runs n token steps costs prefill(B) + n * decode(B);
  each finished row then costs `score_s` (environment step) and `emit_s` (encode + send).

  Continuous batching (`sao_jax.slots`) has its own programs over a state of `slot_rows`
  slots: a fill call over R prompt rows costs fill(R); a decode call costs `decode_call_s`
  plus, per token step, slot_decode(live slots); taking new weights with completions in
  flight costs refresh(slots). Where these were not measured, fill falls back to prefill
  and a decode step to decode(compiled rows), with no per-call or refresh cost.
  """

  decode_s: Points  # seconds per token step of a call compiled for B rows
  prefill_s: Points  # per-call fixed part (prompt forward, dispatch, host<->device)
  score_s: float = 0.0
  emit_s: float = 0.0
  start_s: float = 0.0  # process start until the first call can run (imports, compile)
  fill_s: Points = ()  # one fill call, by the prompt rows it is compiled for
  slot_decode_s: Points = ()  # seconds per decode step, by live slots (of `slot_rows`)
  slot_rows: int = 0  # slots of the state that slot_decode_s was measured on
  decode_call_s: float = 0.0  # per decode call: dispatch and the host's reads of the state
  refresh_s: Points = ()  # every slot's cache recomputed under new weights, by slots

  def __post_init__(self):
    _check(
      min(self.score_s, self.emit_s, self.start_s, self.decode_call_s) >= 0,
      "profile costs must be >= 0",
    )
    _check(
      not self.slot_decode_s or self.slot_rows >= 1,
      "profile.slot_decode_s needs slot_rows >= 1 (the slots it was measured with)",
    )


@dataclasses.dataclass(frozen=True)
class Costs:
  """Everything the simulator charges time for (seconds unless named otherwise)."""

  profiles: Mapping[str, Profile]
  update_s: Mapping[str, Points]  # per update kind ("sao", "grpo"): rows -> seconds
  lengths: tuple[int, ...]  # completion tokens of sampled trajectories (empirical)
  first_update_extra_s: Mapping[str, float] = dataclasses.field(default_factory=dict)
  step_overhead_s: Mapping[str, float] = dataclasses.field(default_factory=dict)
  periodic: Mapping[str, tuple[tuple[str, int, float], ...]] = dataclasses.field(
    default_factory=dict
  )  # kind -> (name, every_steps, seconds)
  publish_s: float = 0.0
  load_s: float = 0.0
  transport_latency_s: float = 0.0
  transport_bytes_per_s: float = float("inf")
  record_bytes: float = 0.0
  record_bytes_per_token: float = 0.0
  update_with_sampling: float = 1.0  # slowdown of an update while a co-located sampler works
  sampling_with_update: float = 1.0  # slowdown of a sampler while a co-located update runs

  def __post_init__(self):
    _check(bool(self.profiles), "costs: no sampling profiles")
    _check(bool(self.update_s), "costs: no update_s")
    _check(
      len(self.lengths) > 0 and all(int(n) >= 1 for n in self.lengths),
      "costs.lengths: needs completion lengths >= 1 token",
    )
    _check(
      self.update_with_sampling >= 1 and self.sampling_with_update >= 1,
      "contention slowdowns must be >= 1",
    )
    _check(
      min(
        self.publish_s,
        self.load_s,
        self.transport_latency_s,
        self.record_bytes,
        self.record_bytes_per_token,
      )
      >= 0,
      "costs must be >= 0",
    )
    _check(self.transport_bytes_per_s > 0, "costs.transport_bytes_per_s must be > 0")
    for kind, items in self.periodic.items():
      _check(
        all(int(every) >= 1 and s >= 0 for _, every, s in items),
        f"costs.periodic[{kind!r}]: every >= 1 and seconds >= 0",
      )

  def update(self, kind: str, rows: int) -> float:
    if kind not in self.update_s:
      raise ConfigError(f"costs.update_s has no {kind!r}; known: {sorted(self.update_s)}")
    return interp(self.update_s[kind], rows)

  def profile(self, name: str) -> Profile:
    if name not in self.profiles:
      raise ConfigError(f"costs.profiles has no {name!r}; known: {sorted(self.profiles)}")
    return self.profiles[name]

  def to_dict(self) -> dict:
    d = dataclasses.asdict(self)
    d["profiles"] = {k: dataclasses.asdict(p) for k, p in self.profiles.items()}
    return d

  @classmethod
  def from_dict(cls, d: Mapping) -> Costs:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - known
    _check(not unknown, f"costs: unknown keys {sorted(unknown)}; known: {sorted(known)}")
    for key in ("profiles", "update_s", "lengths"):
      _check(key in d, f"costs: missing {key!r}")
    kw = dict(d)
    pfields = {f.name for f in dataclasses.fields(Profile)}
    profiles = {}
    for name, p in d["profiles"].items():
      _check(
        set(p) <= pfields, f"costs.profiles[{name!r}]: unknown keys {sorted(set(p) - pfields)}"
      )
      optional = {
        k: _points(p[k], f"{name}.{k}") if p.get(k) else ()
        for k in ("fill_s", "slot_decode_s", "refresh_s")
      }
      profiles[name] = Profile(
        **{
          **p,
          "decode_s": _points(p["decode_s"], f"{name}.decode_s"),
          "prefill_s": _points(p["prefill_s"], f"{name}.prefill_s"),
          **optional,
        }
      )
    kw["profiles"] = profiles
    kw["update_s"] = {k: _points(v, f"update_s[{k}]") for k, v in d["update_s"].items()}
    kw["lengths"] = tuple(int(n) for n in d["lengths"])
    kw["periodic"] = {
      k: tuple((str(n), int(e), float(s)) for n, e, s in v)
      for k, v in d.get("periodic", {}).items()
    }
    return cls(**kw)

  def replace(self, **kw) -> Costs:
    return dataclasses.replace(self, **kw)


@dataclasses.dataclass(frozen=True)
class Scenario:
  """What to simulate. Each field mirrors a knob of the real runners (sao.*, rl.*).

  policy:
    grpo            synchronous: a step's `batch_size` rows are sampled (by the learner
                    itself with `inline`, else by the samplers: batch calls, or with
                    `continuous` continuous batching), all of them are waited for, one
                    update, weights published, samplers load them; repeat.
    sao_batch       asynchronous, batch calls: a call takes up to `slots` tasks and
                    decodes until its longest row ends; new weights between calls.
    sao_continuous  asynchronous, continuous batching: free slots are refilled between
                    decode calls, `refill_rows` prompts per fill call, and a decode call
                    runs until `refill_rows` of its rows have ended (or all of them).
                    New weights are taken between decode calls: with `inflight` at once
                    (rows keep decoding after the caches are refreshed); without, the
                    sampler stops refilling, drains, loads, refills.
  """

  policy: str = "sao_batch"
  inflight: bool = False
  continuous: bool = False  # grpo through samplers: they run continuous batching
  refill_rows: int = 0  # continuous (sao.refill_rows); 0: every free slot in one fill call,
  #                       and a decode call ends when its first row does
  num_samplers: int = 1
  slots: int = 64
  batch_size: int = 128  # rows per update (GRPO: prompts_per_step x group_size)
  max_staleness: int = 4
  param_sync_every: int = 1
  target_depth: int = 0  # tasks in flight; 0: batch_size + 2 * num_samplers * slots (runner)
  inline: bool = False  # grpo: the learner process samples (no sampler processes)
  colocated: bool = False  # samplers share the learner's cores (contention slowdowns apply)
  shape: str = "fixed"  # decode cost by the compiled rows ("fixed") or by live rows ("active")
  idle_poll_s: float = 0.2  # an idle sampler's task-read timeout: it polls weights that often
  sampler_profile: str = "sampler"
  inline_profile: str = "inline"
  update_kind: str = ""  # key of costs.update_s; "": "grpo" for grpo, else "sao"
  seconds: float = 0.0  # horizon: the learner starts no step after this many seconds
  steps: int = 0  # horizon in learner steps (the first of seconds/steps reached ends it)
  seed: int = 0
  steady_after: int = 10  # steady-state metrics leave out this many first updates

  def __post_init__(self):
    _check(
      self.policy in POLICIES,
      f"scenario.policy {self.policy!r} unknown; known: {', '.join(POLICIES)}",
    )
    _check(
      not self.inflight or self.policy == "sao_continuous",
      "scenario.inflight needs policy sao_continuous",
    )
    _check(not self.inline or self.policy == "grpo", "scenario.inline needs policy grpo")
    _check(
      not self.continuous or (self.policy == "grpo" and not self.inline),
      "scenario.continuous is for grpo through samplers (SAO: policy sao_continuous)",
    )
    _check(
      0 <= self.refill_rows <= self.slots,
      f"scenario.refill_rows {self.refill_rows} not in 0..slots {self.slots}",
    )
    _check(self.num_samplers >= 1 or self.inline, "scenario.num_samplers must be >= 1")
    _check(self.slots >= 1 and self.batch_size >= 1, "scenario slots and batch_size >= 1")
    _check(
      self.max_staleness >= 0 and self.param_sync_every >= 1 and self.target_depth >= 0,
      "scenario: max_staleness >= 0, param_sync_every >= 1, target_depth >= 0",
    )
    _check(
      self.shape in ("fixed", "active"),
      f"scenario.shape {self.shape!r} unknown; known: active, fixed",
    )
    _check(self.seconds > 0 or self.steps > 0, "scenario needs a horizon: seconds or steps > 0")
    _check(self.idle_poll_s >= 0, "scenario.idle_poll_s must be >= 0")
    _check(
      self.seconds >= 0 and self.steps >= 0 and self.steady_after >= 0,
      "scenario horizon and steady_after must be >= 0",
    )

  @property
  def kind(self) -> str:
    return self.update_kind or ("grpo" if self.policy == "grpo" else "sao")

  @property
  def continuous_samplers(self) -> bool:
    return self.policy == "sao_continuous" or self.continuous

  @property
  def depth(self) -> int:
    return self.target_depth or self.batch_size + 2 * self.num_samplers * self.slots


# Named policies for the command line and the experiment scripts.
PRESETS = {
  "grpo_inline": dict(policy="grpo", inline=True),  # learner samples itself
  "grpo": dict(policy="grpo"),  # sampler processes (batch calls), barrier
  "grpo_continuous": dict(policy="grpo", continuous=True),  # ... continuous batching
  "sao_batch": dict(policy="sao_batch"),
  "sao_continuous": dict(policy="sao_continuous"),
  "sao_inflight": dict(policy="sao_continuous", inflight=True),
}
_POLICY_FIELDS = dict(inline=False, inflight=False, continuous=False)


def preset(name: str, base: Scenario) -> Scenario:
  """`base` with the policy fields of a named preset (see PRESETS)."""
  if name not in PRESETS:
    raise ConfigError(f"unknown policy {name!r}; known: {', '.join(PRESETS)}")
  return dataclasses.replace(base, **{**_POLICY_FIELDS, **PRESETS[name]})


def lengths_summary(lengths: Sequence[int]) -> dict:
  a = np.asarray(lengths, float)
  return {
    "n": int(a.size),
    "mean": float(a.mean()),
    "p50": float(np.median(a)),
    "p95": float(np.percentile(a, 95)),
    "max": float(a.max()),
    "cv": float(a.std() / a.mean()),
  }
