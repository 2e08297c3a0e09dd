"""The SAO learner's statistics: counters, restart transients, each update's metric row and
the phase summary. It runs no process and opens no file but the event log it is given, so
it is tested with tiny inputs alone (tests/test_learner_statistics.py)."""

from __future__ import annotations

import collections
import os
import pathlib
import time

import numpy as np

from sao_jax import procs, recovery, startup
from sao_jax.buffer import Item
from sao_jax.metrics import MetricsWriter, peak_memory_mb
from sao_jax.runners.common import delay_stats, length_stats

# learner_busy_steady leaves out this many first updates of a process: sampler start-up, the
# first compilations and (Kafka) the consumer-group join are paid once per run, not per update.
STEADY_AFTER = 10
STALENESS_BINS = 8  # histogram buckets 0..7, the last one is ">= 7"
# Updates watched after each start, resume or rollback (staleness, off-policy deviation, drops):
# the restart transient in the event log, the metrics and summary.json.
TRANSIENT_UPDATES = 20

# Start-up stages of a learner process, in order (`sao_jax.startup` marks): imports until the
# run begins; setup (config, tokenizer, task load); restore_init (the SFT result the phase
# starts from); samplers_started (processes spawned, topics made); compile_init; restore (the
# snapshot); first_record (samplers imported, compiled and decoded); first_update (batch
# filled, update compiled or loaded from the cache, applied).
STARTUP_STAGES = [
  "imports",
  "setup",
  "restore_init",
  "samplers_started",
  "compile_init",
  "restore",
  "first_record",
  "first_update",
]


class Statistics:
  """What the learner counts and reports. `counts` is the one counter that the other parts
  (admission guard, intake, safety) add to and that snapshots save; `events` is process 0's
  event log (None in the other processes, whose counters are not written)."""

  def __init__(self, writer: MetricsWriter, events: recovery.EventLog | None = None):
    self.writer, self.events = writer, events
    self.counts: collections.Counter = collections.Counter()
    self.counts_at_start: dict[str, int] = {}
    self.transients: list[dict] = []  # the first updates after each start, resume, rollback
    self.busy = 0.0  # seconds inside the jitted update
    self.reward_s = 0.0  # samplers' environment-step (reward) seconds of consumed trajectories
    self.sandbox_runs = 0  # sandbox executions that scored consumed trajectories
    self.delays: list[float] = []  # trajectory end -> its update
    self.lengths: list[int] = []  # tokens per used trajectory
    self.rss_peak = 0.0
    self.steady_from = 0
    self.steady_mark: tuple[float, float] | None = None  # (busy, wall) after the first updates
    self.t_loop = 0.0
    self.resume_info: dict | None = None  # set on a resume until the first update is logged

  def event(self, kind: str, **fields) -> None:
    """A line in the event log (process 0's; nothing elsewhere)."""
    if self.events is not None:
      self.events.write(kind, **fields)

  def close(self) -> None:
    if self.events is not None:
      self.events.close()

  def begin(self, step: int) -> None:
    """This incarnation starts at `step` with the counters it has now (restored or not)."""
    self.steady_from = step
    self.counts_at_start = dict(self.counts)

  def count_deltas(self) -> dict[str, int]:
    """This incarnation's counters: what it added since it started (the event log sums the
    incarnations; the snapshot's counters are the restored lineage's)."""
    start = self.counts_at_start
    return {k: int(v - start.get(k, 0)) for k, v in self.counts.items() if v != start.get(k, 0)}

  # Transients -------------------------------------------------------------------------------
  def begin_transient(self, why: str, step: int, lineage: str | None) -> None:
    """Watches the first updates of a lineage begun at `step` (a start, resume or rollback)."""
    self.transients.append(
      {
        "why": why,
        "step": step,
        "lineage": lineage,
        "updates": 0,
        "staleness_mean": 0.0,
        "staleness_max": 0,
        "is_dev_mean": 0.0,
        "is_dev_max": 0.0,
        "kl_behaviour_mean": 0.0,
        "dropped_stale": 0,
        "dropped_lineage": 0,
        "weighted_lineage": 0,
        "orphan_version": 0,
      }
    )

  def watch_transient(
    self, step: int, metrics, staleness, stale: int, discarded: int, weighted: int, orphans: int
  ) -> None:
    """Adds one update to the transient of the newest lineage while it is in its first
    `TRANSIENT_UPDATES` updates: written to the event log as it goes (a killed incarnation's
    partial one is kept) and to the metrics once complete."""
    if not self.transients or self.transients[-1]["updates"] >= TRANSIENT_UPDATES:
      return
    t = self.transients[-1]
    n = t["updates"] = t["updates"] + 1
    mean = lambda key, x: t[key] + (float(x) - t[key]) / n  # noqa: E731 - a running mean
    t["staleness_mean"] = mean("staleness_mean", np.mean(staleness))
    t["staleness_max"] = max(t["staleness_max"], int(np.max(staleness)))
    if "is_dev" in metrics:  # SAO's update; synchronous GRPO's (through samplers) has none
      t["is_dev_mean"] = mean("is_dev_mean", metrics["is_dev"])
      t["is_dev_max"] = max(t["is_dev_max"], float(metrics["is_dev"]))
      t["kl_behaviour_mean"] = mean("kl_behaviour_mean", metrics["kl_behaviour"])
    t["dropped_stale"] += stale
    t["dropped_lineage"] += discarded
    t["weighted_lineage"] += weighted
    t["orphan_version"] += orphans
    self.event("transient", **t)
    if n == TRANSIENT_UPDATES:
      self.writer.write(step, dict(t, event="transient"), phase="rl_event", advance=0)

  # Per update -------------------------------------------------------------------------------
  def timed(self, step: int, tu: float, t_done: float) -> None:
    """The update that became `step` ran from `tu` to `t_done`; after the first
    `STEADY_AFTER` updates of this incarnation the steady-state mark is taken."""
    self.busy += t_done - tu
    if step == self.steady_from + STEADY_AFTER:  # start and warm-up over from here
      self.steady_mark = (self.busy, time.time() - self.t_loop)

  def first_update(self, step: int, t_done: float, compile_cache: str | None) -> None:
    """After a resume, the first update (ended at `t_done`) closes the restart: its time
    and start-up breakdown go to the metrics and the event log, once."""
    info = self.resume_info
    if info is None or "recovery_s" in info:
      return
    # The first update ended at t_done (before the ledger write): the restart's time and
    # its last stage both end there, so the stages add up to it whatever the ledger took.
    info["recovery_s"] = startup.mark("first_update", at=t_done)
    info["breakdown_s"] = startup.breakdown(STARTUP_STAGES)
    info["compile_cache"] = compile_cache
    self.counts["recovery_ms_total"] += int(1000 * info["recovery_s"])
    self.writer.write(step, info, phase="rl_event", advance=0)
    self.event("resume", step=step, **{k: v for k, v in info.items() if k != "event"})
    print(f"sao: first update {info['recovery_s']:.1f} s after the restart", flush=True)

  def consumed(self, items: list[Item], t_done: float) -> None:
    """Counts the records an update (ended at `t_done`) trained on."""
    self.counts["consumed"] += len(items)
    self.reward_s += sum(it.rec.meta.get("reward_s", 0.0) for it in items)
    self.sandbox_runs += sum(it.rec.meta.get("sandbox_runs", 0) for it in items)
    lengths = [int(it.rec.arrays["valid"].sum()) for it in items]  # sampled tokens
    self.counts["tokens"] += sum(lengths)
    self.lengths.extend(lengths)
    # (replayed records waited through the crash: not a transport delay)
    self.delays.extend(t_done - it.rec.meta["t_end"] for it in items if not it.replayed)

  def row(
    self,
    metrics,
    staleness: np.ndarray,
    tu: float,
    t_done: float,
    val_acc: float | None,
    *,
    rows: int,
    queue_depth: int,
    outstanding: int,
    train_seconds: float,
  ) -> dict:
    """The metric row of one update: its metrics, staleness, utilisation and counters."""
    # The learner's whole process tree (samplers and a local broker included), by the one
    # method the benchmark uses too (sao_jax.procs.tree_memory_mb), sampled at each row.
    self.rss_peak = max(self.rss_peak, procs.tree_memory_mb(os.getpid())["rss"])
    wall = time.time() - self.t_loop
    hist = np.bincount(np.minimum(staleness, STALENESS_BINS - 1), minlength=STALENESS_BINS)
    c = self.counts
    row = dict(
      metrics,
      accuracy=float(metrics["reward"]),
      staleness_mean=float(staleness.mean()),
      staleness_max=int(staleness.max()),
      staleness_hist=hist.tolist(),
      learner_busy=self.busy / max(wall, 1e-9),
      queue_depth=queue_depth,
      outstanding_tasks=outstanding,
      delay_mean=float(np.mean(self.delays[-rows:])) if self.delays else None,
      learner_time=t_done - tu,
      trajectories=c["consumed"],
      dropped_stale=c["dropped_stale"],
      dropped_lineage=c["dropped_lineage"],
      weighted_lineage=c["weighted_lineage"],
      bad_records=c["bad_records"],
      duplicates=c["duplicates"],
      duplicate_answers=c["duplicate_answers"],
      rejected=c["rejected"],
      nonfinite_total=c["nonfinite_skipped"],
      rollbacks=c["rollbacks"],
      sampler_restarts=c["sampler_restarts"],
      train_seconds=train_seconds,
      trajectories_per_s=c["consumed"] / max(wall, 1e-9),
      peak_memory_mb=peak_memory_mb(),
      peak_rss_all_mb=self.rss_peak,
    )
    if val_acc is not None:
      row["val_accuracy"] = val_acc
    return row

  # End of the phase -------------------------------------------------------------------------
  def summary(
    self,
    info: dict,
    wall: float,
    step: int,
    *,
    unused_at_end: int,
    audit_held: int,
    guard: dict,
    lineage: str | None,
    events_path: pathlib.Path,
  ) -> dict:
    """`info` (`finish_phase`'s) with the phase's counters, rates and utilisation, the
    admission `guard`'s summary, and the lifetime totals of the event log at `events_path`
    (every process that ran this phase, killed ones too)."""
    c = self.counts
    steady = None
    if self.steady_mark is not None and wall > self.steady_mark[1]:
      steady = (self.busy - self.steady_mark[0]) / (wall - self.steady_mark[1])
    info.update(
      trajectories=c["consumed"],
      dropped_stale=c["dropped_stale"],
      bad_records=c["bad_records"],
      duplicates=c["duplicates"],
      duplicate_answers=c["duplicate_answers"],
      unused_at_end=unused_at_end,
      audited=c["audited"],
      audit_errors=c["audit_errors"],
      audit_held_at_end=audit_held,
      nonfinite_skipped=c["nonfinite_skipped"],
      rollbacks=c["rollbacks"],
      sampler_restarts=c["sampler_restarts"],
      resumes=c["resumes"],
      orphan_version=c["orphan_version"],
      dropped_lineage=c["dropped_lineage"],
      weighted_lineage=c["weighted_lineage"],
      lineage=lineage,
      learner_busy=self.busy / max(wall, 1e-9),
      learner_busy_steady=steady,
      trajectories_per_s=c["consumed"] / max(wall, 1e-9),
      tokens_per_s=c["tokens"] / max(wall, 1e-9),
      peak_rss_all_mb=self.rss_peak,
      reward_s_per_trajectory=self.reward_s / max(c["consumed"], 1),
      learner_peak_mb=peak_memory_mb(),
      seconds_per_step=info["seconds"] / max(step - self.steady_from, 1),
      sandbox_runs=self.sandbox_runs,
      sandbox_runs_per_s=self.sandbox_runs / max(wall, 1e-9),
      **guard,
      **delay_stats(self.delays),
      **length_stats(self.lengths),
    )
    if self.resume_info is not None:
      info["recovery_s"] = self.resume_info.get("recovery_s")
    info["lifetime"] = recovery.EventLog.lifetime(events_path, "rl")
    # The first TRANSIENT_UPDATES updates of each lineage (start, resumes, rollbacks).
    info["transients"] = info["lifetime"].pop("transients")
    return info
