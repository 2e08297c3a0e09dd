"""Discrete-event simulation of the sampler -> transport -> learner pipeline.

An event queue (heapq) over simulated seconds. Work is charged in *solo seconds*, the
time it takes with its machine to itself; processes on one host (`Scenario.colocated`)
share cores by the measured slowdowns, so a running piece of work is rescheduled whenever
the set of work on its host changes (processor sharing). Token steps are not events: a
decoding sampler advances all live rows at once to the end of its call, so events scale
with trajectories, not tokens.

The learner loop mirrors `sao_jax.runners.sao.SAOLearner` (top up tasks to a target depth
while a batch is short, take the next `batch_size` fresh records, drop those older than
`max_staleness` versions, update, publish every `param_sync_every` updates),
`sao_jax.runners.grpo.run_grpo` (sample the whole batch in the learner, wait for all,
update) and `SyncGRPOLearner` (the same through sampler processes). A continuous sampler
mirrors `sao_jax.rollout.ContinuousSampler` in a sampler process: take new weights (and,
with completions in flight, refresh their caches), refill free slots, one decode call until
`refill_rows` completions end, step their environments, send. Metrics are defined as the
benchmark defines them:

  trajectories/s       consumed trajectories / wall
  learner busy         update seconds / wall
  delay                update done - trajectory end, where "end" is when the sampler hands
                       the record on (the end of its call, batch or continuous decode
                       call); `delay_own_*` measures from each row's own last token, so it
                       also counts the wait for the rest of its call
  step latency         mean seconds between learner updates (= 1 / steps per second)
  staleness            learner step - policy version of the record, at use
Deterministic: one numpy Generator (seeded by the scenario) draws every length, and ties
in the event queue break by insertion order.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
from collections.abc import Callable

import numpy as np

from sao_jax.sim.costs import Costs, Profile, Scenario, interp

STALENESS_BINS = 8  # as in runners.learner_parts.statistics: buckets 0..7, the last ">= 7"
_EPS = 1e-9


@dataclasses.dataclass
class _Rec:
  version: int
  length: int
  t_finish: float  # the row's last token
  t_end: float  # handed on by the sampler (what the real runner stamps as t_end)


class _Work:
  __slots__ = ("host", "kind", "remaining", "rate", "t_last", "token", "on_done", "live")

  def __init__(self, host, kind, solo_s, on_done):
    self.host, self.kind, self.remaining, self.on_done = host, kind, max(0.0, solo_s), on_done
    self.rate, self.t_last, self.token, self.live = 0.0, 0.0, 0, True


class _Host:
  """Cores shared by the work started on them."""

  def __init__(self, update_slowdown: float, sample_slowdown: float):
    self.works: list[_Work] = []
    self.update_slowdown, self.sample_slowdown = update_slowdown, sample_slowdown

  def rate(self, kind: str, kinds: set[str]) -> float:
    if kind == "update" and "sample" in kinds:
      return 1.0 / self.update_slowdown
    if kind == "sample" and "update" in kinds:
      return 1.0 / self.sample_slowdown
    return 1.0


@dataclasses.dataclass
class _Sampler:
  idx: int
  host: _Host
  version: int = -1
  waiting: bool = False  # idle until tasks (or a new version) arrive
  started: bool = False
  work: _Work | None = None
  t0: float = 0.0  # when `work` started
  wait_since: float = 0.0
  wait_epoch: int = 0
  rows: list = dataclasses.field(default_factory=list)  # continuous: [remaining, version, length]
  busy_s: float = 0.0
  row_steps: float = 0.0  # compiled rows x token steps run
  useful_steps: float = 0.0  # live rows x token steps run


class Simulation:
  """One run of `scenario` with `costs`; `run()` returns the metrics dict."""

  def __init__(self, costs: Costs, scenario: Scenario):
    self.c, self.s = costs, scenario
    self.rng = np.random.default_rng(scenario.seed)
    self.lengths = np.asarray(costs.lengths, np.int64)
    self.now = 0.0
    self._q: list = []
    self._seq = itertools.count()
    self.ended = False
    share = (costs.update_with_sampling, costs.sampling_with_update)
    self.learner_host = _Host(*share)
    self.sprof: Profile = costs.profile(scenario.sampler_profile)
    self.iprof: Profile | None = costs.profile(scenario.inline_profile) if scenario.inline else None
    n = 0 if scenario.inline else scenario.num_samplers
    self.samplers = [
      _Sampler(i, self.learner_host if scenario.colocated else _Host(*share)) for i in range(n)
    ]
    # learner state
    self.step = 0
    self.published = 0
    self.tasks = 0
    self.outstanding = 0
    self.inbox: list[_Rec] = []
    self.buffer: collections.deque[_Rec] = collections.deque()
    self.buffer_versions: collections.Counter[int] = collections.Counter()
    self.waiting = False
    self.expect = 0  # grpo with samplers: rows still to arrive this step
    self.busy = 0.0
    self.consumed = 0
    self.tokens = 0
    self.dropped = 0
    self.delays: list[float] = []
    self.delays_own: list[float] = []
    self.staleness: list[int] = []
    self.update_done: list[float] = []  # t of each update's end
    self.log_points: list[tuple[float, int, float]] = []  # (t after step, consumed, busy)
    self.steady_mark: tuple[float, float, int] | None = None  # (t, busy, consumed)
    self.wall = 0.0

  # -- event queue and processor-shared work ----------------------------------------------

  def at(self, t: float, fn: Callable, *args):
    heapq.heappush(self._q, (t, next(self._seq), fn, args))

  def start(self, host: _Host, kind: str, solo_s: float, on_done: Callable) -> _Work:
    w = _Work(host, kind, solo_s, on_done)
    w.t_last = self.now
    host.works.append(w)
    self._rescale(host, fresh=w)
    return w

  def _rescale(self, host: _Host, fresh: _Work | None = None):
    kinds = {w.kind for w in host.works}
    for w in host.works:
      w.remaining = max(0.0, w.remaining - (self.now - w.t_last) * w.rate)
      w.t_last = self.now
      rate = host.rate(w.kind, kinds)
      if rate != w.rate or w is fresh:
        w.rate = rate
        w.token += 1
        self.at(self.now + w.remaining / rate, self._finish, w, w.token)

  def _finish(self, w: _Work, token: int):
    if token != w.token or not w.live:
      return
    w.live = False
    w.host.works.remove(w)
    self._rescale(w.host)
    w.on_done()

  def draw(self, n: int) -> np.ndarray:
    return self.lengths[self.rng.integers(0, len(self.lengths), n)]

  # -- run ------------------------------------------------------------------------------------

  def run(self) -> dict:
    s = self.s
    for sp in self.samplers:
      self.at(self.sprof.start_s, self._sampler_start, sp)
    self.at(0.0, self._learner_loop)
    while self._q and not self.ended:
      t, _, fn, args = heapq.heappop(self._q)
      self.now = max(self.now, t)
      fn(*args)
    if not self.ended:
      raise RuntimeError(
        f"simulation stalled at t={self.now:.3f} s, step {self.step}: no work left (scenario {s})"
      )
    return self._metrics()

  def _horizon_reached(self) -> bool:
    s = self.s
    return bool((s.steps and self.step >= s.steps) or (s.seconds and self.now >= s.seconds))

  def _end(self):
    self.ended = True
    self.wall = self.now
    for sp in self.samplers:
      if sp.work is not None and sp.work.live:
        sp.busy_s += self.now - sp.t0
    self._q.clear()

  # -- learner --------------------------------------------------------------------------------

  def _learner_loop(self):
    if self._horizon_reached():
      self._end()
      return
    if self.s.policy == "grpo":
      if self.s.inline:
        self._grpo_inline()
      else:
        self.expect = self.s.batch_size
        self._put_tasks(self.s.batch_size)
        self.waiting = True
      return
    self._gather()

  def _fresh(self) -> int:
    oldest = self.step - self.s.max_staleness
    return sum(n for v, n in self.buffer_versions.items() if v >= oldest)

  def _gather(self):
    # as the runner's loop: while the buffer lacks a fresh batch, top the tasks up, then take
    # up to a batch of what has arrived; records that arrived during an update wait in the
    # transport (the inbox) until this loop reads them, so the top-up runs on most steps
    bs = self.s.batch_size
    while self._fresh() < bs:
      want = self.s.depth - self.outstanding
      if want > 0:
        self.outstanding += want
        self._put_tasks(want)
      if not self.inbox:
        self.waiting = True
        return
      chunk, self.inbox = self.inbox[:bs], self.inbox[bs:]
      self.buffer.extend(chunk)
      self.buffer_versions.update(r.version for r in chunk)
      self.outstanding = max(0, self.outstanding - len(chunk))
    self.waiting = False
    batch = []
    while len(batch) < bs:
      r = self.buffer.popleft()
      self.buffer_versions[r.version] -= 1
      if self.step - r.version > self.s.max_staleness:
        self.dropped += 1
      else:
        batch.append(r)
    self._update(batch)

  def _arrive(self, recs: list[_Rec]):
    if self.ended:
      return
    self.inbox.extend(recs)
    if not self.waiting:
      return
    if self.s.policy == "grpo":
      if len(self.inbox) >= self.expect:
        batch, self.inbox = self.inbox[: self.expect], self.inbox[self.expect :]
        self.waiting = False
        self._update(batch)
    else:
      self._gather()

  def _update(self, batch: list[_Rec]):
    kind = self.s.kind
    solo = self.c.update(kind, len(batch))
    if self.step == 0:
      solo += self.c.first_update_extra_s.get(kind, 0.0)
    t0 = self.now
    self.start(self.learner_host, "update", solo, lambda: self._updated(batch, t0))

  def _updated(self, batch: list[_Rec], t0: float):
    s = self.s
    self.busy += self.now - t0
    for r in batch:
      self.delays.append(self.now - r.t_end)
      self.delays_own.append(self.now - r.t_finish)
      self.staleness.append(min(self.step - r.version, s.max_staleness + 1))
      self.tokens += r.length
    self.consumed += len(batch)
    self.step += 1
    self.update_done.append(self.now)
    kind = s.kind
    post = self.c.step_overhead_s.get(kind, 0.0)
    post += sum(sec for _, every, sec in self.c.periodic.get(kind, ()) if self.step % every == 0)
    publish = not s.inline and self.step % s.param_sync_every == 0
    if publish:
      post += self.c.publish_s
    self.start(self.learner_host, "other", post, lambda: self._stepped(publish))

  def _stepped(self, publish: bool):
    self.log_points.append((self.now, self.consumed, self.busy))
    if self.step == self.s.steady_after:
      self.steady_mark = (self.now, self.busy, self.consumed)
    if publish:
      self.published = self.step
      for sp in self.samplers:
        self._notify_version(sp)
    self._learner_loop()

  def _grpo_inline(self):
    s, p = self.s, self.iprof
    lengths = self.draw(s.batch_size)
    solo = self._call_seconds(p, lengths, s.batch_size) + p.score_s * len(lengths)
    if self.step == 0:
      solo += p.start_s  # the sampling program compiles on first use
    t0 = self.now
    self.start(self.learner_host, "sample", solo, lambda: self._grpo_sampled(lengths, t0, solo))

  def _grpo_sampled(self, lengths, t0: float, solo: float):
    ends = self._row_ends(self.iprof, lengths, self.s.batch_size, t0, solo)
    recs = [_Rec(self.step, int(n), e, self.now) for n, e in zip(lengths, ends, strict=True)]
    self._update(recs)

  def _row_ends(
    self, p: Profile, lengths: np.ndarray, compiled: int, t0: float, solo: float
  ) -> np.ndarray:
    """When each row of a call emitted its last token: the call's solo schedule (prefill,
    then the token steps at the call's mean cost per step), stretched to its real length."""
    prefill = interp(p.prefill_s, compiled)
    top = float(np.max(lengths))
    per_step = max(0.0, solo - prefill - p.score_s * len(lengths)) / top
    stretch = (self.now - t0) / solo if solo > 0 else 1.0
    return t0 + stretch * (prefill + per_step * lengths.astype(float))

  # -- samplers -------------------------------------------------------------------------------

  def _wait(self, sp: _Sampler):
    sp.waiting = True
    sp.wait_since = self.now
    sp.wait_epoch += 1

  def _put_tasks(self, n: int):
    self.tasks += n
    for sp in self.samplers:
      if sp.waiting:
        sp.waiting = False
        # a sampler blocked in its task read runs the tasks with the weights it holds: it
        # polls for new weights only between reads (see _notify_version)
        self.at(self.now, self._sampler_next, sp, True)

  def _notify_version(self, sp: _Sampler):
    # A working sampler sees the new version when its call returns (a jitted call is not
    # interrupted); an idle one polls for weights each time its task read times out.
    if sp.started and sp.waiting:
      poll = self.s.idle_poll_s
      k = np.ceil((self.now - sp.wait_since) / poll) if poll > 0 else 0
      self.at(sp.wait_since + k * poll, self._idle_poll, sp, sp.wait_epoch)

  def _idle_poll(self, sp: _Sampler, epoch: int):
    if sp.waiting and sp.wait_epoch == epoch:
      sp.waiting = False
      self._sampler_next(sp)

  def _run(self, sp: _Sampler, solo: float, then: Callable):
    def done():
      sp.busy_s += self.now - sp.t0
      then()

    sp.t0 = self.now
    sp.work = self.start(sp.host, "sample", solo, done)

  def _sampler_start(self, sp: _Sampler):
    sp.started = True
    self._sampler_next(sp)

  def _sampler_next(self, sp: _Sampler, got_tasks: bool = False):
    if self.ended:
      return
    if self.s.continuous_samplers:
      self._continuous_next(sp)
      return
    # synchronous GRPO's tasks belong to the new version: its samplers always load it first
    stale_ok = got_tasks and self.tasks and self.s.policy != "grpo"
    if sp.version != self.published and not stale_ok:
      v = self.published
      self._run(sp, self.c.load_s, lambda: self._loaded(sp, v))
      return
    n = min(self.s.slots, self.tasks)
    if n == 0:
      self._wait(sp)
      return
    self.tasks -= n
    lengths = self.draw(n)
    solo = self._call_seconds(self.sprof, lengths, self.s.slots, sp)
    solo += self.sprof.score_s * n
    version, t0 = sp.version, self.now
    self._run(sp, solo, lambda: self._batch_done(sp, lengths, version, t0, solo))

  def _loaded(self, sp: _Sampler, v: int):
    sp.version = v
    self._sampler_next(sp)

  def _call_seconds(
    self, p: Profile, lengths: np.ndarray, compiled: int, sp: _Sampler | None = None
  ) -> float:
    """prefill + the token steps of one call that runs until its longest row ends."""
    srt = np.sort(lengths)
    if self.s.shape == "fixed":
      steps = float(srt[-1]) * interp(p.decode_s, compiled)
      run = compiled * float(srt[-1])
    else:  # cost follows the live rows: between consecutive row ends, n - i rows remain
      prev, steps = 0, 0.0
      for i, n in enumerate(srt):
        steps += float(n - prev) * interp(p.decode_s, len(srt) - i)
        prev = n
      run = float(srt.sum())
    if sp is not None:
      sp.row_steps += run
      sp.useful_steps += float(srt.sum())
    return interp(p.prefill_s, compiled) + steps

  def _batch_done(self, sp: _Sampler, lengths: np.ndarray, version: int, t0: float, solo: float):
    t_end = self.now
    # every row of the call is handed on when the call returns (its longest row ended)
    ends = self._row_ends(self.sprof, lengths, self.s.slots, t0, solo)
    recs = [_Rec(version, int(n), e, t_end) for n, e in zip(lengths, ends, strict=True)]
    self._run(sp, self.sprof.emit_s * len(recs), lambda: self._emit(sp, recs))

  def _emit(self, sp: _Sampler, recs: list[_Rec]):
    nbytes = sum(self.c.record_bytes + self.c.record_bytes_per_token * r.length for r in recs)
    delay = self.c.transport_latency_s + nbytes / self.c.transport_bytes_per_s
    if recs:
      self.at(self.now + delay, self._arrive, recs)
    self._sampler_next(sp)

  # -- continuous batching ----------------------------------------------------------------------

  def _fill_s(self, rows: int) -> float:
    p = self.sprof
    return interp(p.fill_s or p.prefill_s, rows)

  def _step_s(self, live: int) -> float:
    """Seconds of one decode step of the slot state with `live` rows decoding."""
    p, s = self.sprof, self.s
    if p.slot_decode_s:  # measured on slot_rows slots; other slot counts scale as decode_s
      scale = (
        1.0
        if s.slots == p.slot_rows
        else (interp(p.decode_s, s.slots) / max(_EPS, interp(p.decode_s, p.slot_rows)))
      )
      return interp(p.slot_decode_s, live) * scale
    return interp(p.decode_s, s.slots if s.shape == "fixed" else live)

  def _decode_s(self, remaining: list[float], steps: float) -> float:
    """Solo seconds of `steps` decode steps over rows with `remaining` steps (ascending):
    the live count falls as rows end inside the call."""
    total, done = 0.0, 0.0
    for i, rem in enumerate(remaining):
      upto = min(rem, steps)
      if upto > done:
        total += (upto - done) * self._step_s(len(remaining) - i)
        done = upto
      if done >= steps:
        break
    return total

  def _continuous_next(self, sp: _Sampler):
    s = self.s
    live = [r for r in sp.rows if r is not None]
    stale = sp.version != self.published
    if stale and (s.inflight or not live):
      v = self.published
      refresh = interp(self.sprof.refresh_s, s.slots) if live and self.sprof.refresh_s else 0.0
      self._run(sp, self.c.load_s + refresh, lambda: self._loaded(sp, v))
      return
    if not sp.rows:
      sp.rows = [None] * s.slots
    free = [i for i, r in enumerate(sp.rows) if r is None]
    k = 0 if stale else min(len(free), self.tasks)  # without in-flight updates: drain first
    if k:
      self.tasks -= k
      for i, n in zip(free[:k], self.draw(k), strict=False):
        sp.rows[i] = [float(n), sp.version, int(n)]
      if s.refill_rows:  # fixed-shape fill calls of refill_rows prompts each
        solo = -(-k // s.refill_rows) * self._fill_s(s.refill_rows)
      else:
        solo = self._fill_s(k)
      self._run(sp, solo, lambda: self._sampler_next(sp))
      return
    if not live:
      self._wait(sp)
      return
    remaining = sorted(r[0] for r in live)
    steps = remaining[min(s.refill_rows or 1, len(live)) - 1]
    solo = self.sprof.decode_call_s + self._decode_s(remaining, steps)
    t0 = self.now
    self._run(sp, solo, lambda: self._span_done(sp, remaining, steps, t0, solo))

  def _span_done(self, sp: _Sampler, remaining: list[float], steps: float, t0: float, solo: float):
    """A decode call of `steps` steps returned: rows that ended are scored and sent."""
    useful = sum(min(rem, steps) for rem in remaining)
    sp.row_steps += self.s.slots * steps if self.s.shape == "fixed" else useful
    sp.useful_steps += useful
    stretch = (self.now - t0) / solo if solo > 0 else 1.0
    recs = []
    for i, r in enumerate(sp.rows):
      if r is None:
        continue
      if r[0] <= steps + _EPS:
        own = t0 + stretch * (self.sprof.decode_call_s + self._decode_s(remaining, r[0]))
        recs.append(_Rec(r[1], r[2], min(own, self.now), self.now))
        sp.rows[i] = None
      else:
        r[0] -= steps
    cost = (self.sprof.score_s + self.sprof.emit_s) * len(recs)
    self._run(sp, cost, lambda: self._emit(sp, recs))

  # -- metrics --------------------------------------------------------------------------------

  def _metrics(self) -> dict:
    s, wall = self.s, max(self.wall, _EPS)
    d = np.asarray(self.delays or [np.nan])
    own = np.asarray(self.delays_own or [np.nan])
    hist = (
      np.bincount(
        np.minimum(np.asarray(self.staleness, int), STALENESS_BINS - 1), minlength=STALENESS_BINS
      )
      if self.staleness
      else np.zeros(STALENESS_BINS)
    )
    out = {
      "policy": s.policy + ("+inflight" if s.inflight else ""),
      "wall_s": self.wall,
      "steps": self.step,
      "trajectories": self.consumed,
      "trajectories_per_s": self.consumed / wall,
      "learner_steps_per_s": self.step / wall,
      "tokens_per_s": self.tokens / wall,
      "learner_busy": self.busy / wall,
      "step_latency_s": wall / self.step if self.step else None,
      "delay_mean_s": float(np.mean(d)),
      "delay_p95_s": float(np.percentile(d, 95)),
      "delay_own_mean_s": float(np.mean(own)),
      "delay_own_p95_s": float(np.percentile(own, 95)),
      "staleness_mean": float(np.mean(self.staleness)) if self.staleness else 0.0,
      "staleness_hist": [int(x) for x in hist],
      "dropped_stale": self.dropped,
      "sampler_busy": (
        float(np.mean([sp.busy_s for sp in self.samplers])) / wall if self.samplers else None
      ),
      "decode_row_efficiency": (
        sum(sp.useful_steps for sp in self.samplers)
        / max(_EPS, sum(sp.row_steps for sp in self.samplers))
        if self.samplers
        else None
      ),
    }
    if (
      self.steady_mark is not None
      and self.log_points
      and self.log_points[-1][0] > self.steady_mark[0]
    ):
      t0, b0, c0 = self.steady_mark
      t1, c1, b1 = self.log_points[-1]
      dt = t1 - t0
      n = self.step - s.steady_after
      out.update(
        learner_busy_steady=(b1 - b0) / dt,
        trajectories_per_s_steady=(c1 - c0) / dt,
        learner_steps_per_s_steady=n / dt,
      )
    else:
      out.update(
        learner_busy_steady=None, trajectories_per_s_steady=None, learner_steps_per_s_steady=None
      )
    return out


def simulate(costs: Costs, scenario: Scenario) -> dict:
  """Runs one simulation; returns its metrics (see the module docstring)."""
  return Simulation(costs, scenario).run()


TABLE_ROWS = (
  ("trajectories_per_s", "trajectories/s", "{:.1f}"),
  ("learner_steps_per_s", "learner steps/s", "{:.3f}"),
  ("learner_busy", "learner busy fraction", "{:.1%}"),
  ("learner_busy_steady", "learner busy, steady", "{:.1%}"),
  ("step_latency_s", "step latency (s)", "{:.3f}"),
  ("delay_mean_s", "sampling->training delay mean (s)", "{:.3f}"),
  ("delay_p95_s", "sampling->training delay p95 (s)", "{:.3f}"),
  ("delay_own_mean_s", "delay from own last token, mean (s)", "{:.3f}"),
  ("staleness_mean", "staleness mean (versions)", "{:.2f}"),
  ("dropped_stale", "dropped as stale", "{:d}"),
  ("decode_row_efficiency", "live rows / compiled rows", "{:.1%}"),
)


def format_table(results: dict[str, dict]) -> str:
  """Metrics of several runs side by side, one column per run."""
  names = list(results)
  lines = [f"{'':38s}" + "".join(f"{n:>20s}" for n in names)]
  for key, label, fmt in TABLE_ROWS:
    cells = []
    for n in names:
      v = results[n].get(key)
      cells.append(f"{fmt.format(v) if v is not None else '-':>20s}")
    lines.append(f"{label:38s}" + "".join(cells))

  def hist(h):  # non-empty buckets as version:count
    return " ".join(f"{k}:{c}" for k, c in enumerate(h) if c)

  lines.append(
    f"{'staleness (versions:count)':38s}"
    + "".join(f"  {hist(results[n]['staleness_hist']):>18s}" for n in names)
  )
  return "\n".join(lines)
