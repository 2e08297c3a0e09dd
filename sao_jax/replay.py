"""`sao-jax replay WORKDIR`: re-execute a finished asynchronous run's updates from its journal
and check, step by step, that they reproduce the run bit for bit.

An asynchronous run is not reproducible by rerunning it: its batches depend on when
trajectories arrived. But the learner journals every record it consumed, in order
(`sao_jax.recovery.Journal`), and the ledger names the records each update applied, so the
batches are known exactly after the fact. With `recovery.keep_journal=True` the ledger also
holds each update's exact loss, gradient norm and a fingerprint of the new parameters' bits
(`sao_jax.state.tree_digest`). Replay rebuilds the phase's starting state the way the
learner did (the SFT result, a fresh optimizer, the same RNG key), re-forms each batch with
the learner's own `batch_from`, runs the same jitted update and compares:

- per step: loss, gradient norm and parameter digest, exactly (NaN equals NaN);
- at every RL snapshot still on disk: every parameter array, bit for bit.

On the CPU, with the same code, config and device count, every step must match; a mismatch
names the first step and field that differ. `--until STEP` stops after that update and writes
the state there (an Orbax snapshot, readable with `sao_jax.checkpoint`) and that update's
batch (`batch_STEP.npz`) for inspection, e.g. to look at what drove a collapse.

What it cannot replay, it refuses by name: a run without the per-step record (run it with
`recovery.keep_journal=True`), a journal whose early segments were pruned, synchronous
in-process GRPO (deterministic from its seed: rerun it; the compressed-memory policy's GRPO
is one), a multi-process learner. A shadow rollback replaces the parameters from outside the
update, so replay stops at the first one and says so.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import time
from collections.abc import Iterator

import jax
import numpy as np

from sao_jax import checkpoint as ckpt_lib
from sao_jax import config as config_lib
from sao_jax import recovery
from sao_jax.buffer import Item
from sao_jax.config import ConfigError
from sao_jax.transport import records

FIELDS = ("loss", "grad_norm", "digest")


class ReplayError(ConfigError):
  """The workdir holds nothing that replay can re-execute (the message says why)."""


def _same(a: float | int, b: float | int) -> bool:
  if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
    return True
  return a == b


def _bits_equal(a, b) -> bool:
  a, b = np.asarray(jax.device_get(a)), np.asarray(jax.device_get(b))
  if a.shape != b.shape or a.dtype != b.dtype:
    return False
  return a.tobytes() == b.tobytes()


def _params_equal(a, b) -> bool:
  """Every array of two parameter trees, bit for bit."""
  return all(_bits_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


class _RecordStore:
  """Journal records by id, read lazily in journal order (the ledger's order follows it
  closely, so only the records that arrived ahead of their batch are held)."""

  def __init__(self, journal: recovery.Journal):
    self._it: Iterator = (
      (rec.record_id, rec) for rec in (records.decode(d) for _, d in journal.read_from(0))
    )
    self._held: dict[int, records.Record] = {}

  def take(self, record_id: int) -> records.Record:
    while record_id not in self._held:
      try:
        rid, rec = next(self._it)
      except StopIteration:
        raise ReplayError(f"record {record_id} named by the ledger is not in the journal") from None
      self._held[rid] = rec
    return self._held.pop(record_id)


@dataclasses.dataclass
class StepResult:
  step: int
  equal: dict[str, bool]
  replayed: dict[str, float | int]
  recorded: dict[str, float | int]
  snapshot_equal: bool | None = None  # params bit-equal to the RL snapshot at this step

  @property
  def ok(self) -> bool:
    return all(self.equal.values()) and self.snapshot_equal is not False


def _batch_arrays(batch, prefix: str = "") -> dict[str, np.ndarray]:
  """A batch's fields as arrays; a nested batch's (MemorySAOBatch.memory) as `memory.<field>`."""
  out = {}
  for f in dataclasses.fields(batch):
    value = getattr(batch, f.name)
    if dataclasses.is_dataclass(value):
      out.update(_batch_arrays(value, f"{prefix}{f.name}."))
    elif value is not None:
      out[prefix + f.name] = np.asarray(value)
  return out


def load_run(workdir: pathlib.Path) -> tuple[config_lib.Config, list[dict]]:
  """The run's config and ledger rows, after checking replay can handle them."""
  path = workdir / "config.json"
  if not path.exists():
    raise ReplayError(f"{workdir} holds no config.json: not a `sao-jax train` workdir")
  cfg = config_lib.read_saved(path)
  if not cfg.rl.uses_samplers:
    raise ReplayError(
      f"{workdir} is a synchronous in-process run (rl.algorithm={cfg.rl.algorithm!r}, "
      "sampling in the learner): it is deterministic from its seed; rerun it to reproduce it"
    )
  if (cfg.distributed.num_processes or 1) > 1:
    raise ReplayError("replay of a multi-process learner is not supported")
  rows = recovery.Ledger(workdir / "ledger.jsonl").rows()
  if not rows:
    raise ReplayError(f"{workdir}/ledger.jsonl is missing or empty: no RL update to replay")
  if any("check" not in r for r in rows):
    raise ReplayError(
      f"{workdir} was trained without recovery.keep_journal=True, so the per-step loss, "
      "gradient norm and parameter digest were not recorded (and the journal was pruned); "
      "train with --set recovery.keep_journal=True to make a run replayable"
    )
  steps = [r["step"] for r in rows]
  if steps != list(range(1, len(steps) + 1)):
    raise ReplayError(f"{workdir}/ledger.jsonl does not hold steps 1..N in order")
  return cfg, rows


def _has_snapshots(directory: pathlib.Path) -> bool:
  mngr = ckpt_lib.reader(directory)
  try:
    return bool(mngr.all_steps())
  finally:
    mngr.close()


def _start_state(s, learner, workdir: pathlib.Path):
  """The phase's first state, built as `SAOLearner.start` built it for a new run."""
  from sao_jax.runners.run import restore_init

  sft = workdir / "checkpoints" / "sft"
  if sft.is_dir() and _has_snapshots(sft):
    init = restore_init(s, str(sft))
  elif s.cfg.init_from:
    init = restore_init(s, s.cfg.init_from)
  else:
    raise ReplayError(f"{workdir} holds no SFT checkpoint and the config names no init_from")
  return learner.initial_state(init)


def _lineage_tree(workdir: pathlib.Path, cfg):
  """The run's lineage tree (`lineages.jsonl`) for an SAO run, measuring discarded lineages
  as the run did (`sao.discarded_lineage`); None for other runs and runs without the log
  (ages are then version differences: the same on a path without rollbacks, and a replay
  stops at the first rollback)."""
  from sao_jax.lineage import LineageLog, LineageTree

  log = workdir / "lineages.jsonl"
  if cfg.rl.algorithm != "sao" or not log.exists():
    return None
  return LineageTree(LineageLog(log).nodes(), weigh_discarded=cfg.sao.discarded_lineage == "weight")


def replay(
  workdir: str | pathlib.Path,
  *,
  until: int | None = None,
  out: str | pathlib.Path | None = None,
  show_progress: bool = True,
) -> dict:
  """Re-executes the run's updates 1..min(until, last); returns the report (also written
  to OUT/replay.json, default WORKDIR/replay/)."""
  import tqdm

  from sao_jax.runners.memory_sao import learner_class
  from sao_jax.setup import make_setup

  t0 = time.time()
  workdir = pathlib.Path(workdir)
  out = pathlib.Path(out) if out else workdir / "replay"
  cfg, rows = load_run(workdir)
  journal = recovery.Journal(workdir / "journal", readonly=True)
  if journal.first_available() != 0:
    raise ReplayError(f"{workdir}/journal: early segments were pruned; nothing to replay from")
  events = recovery.EventLog.rows(workdir / "events.jsonl")
  rollbacks = sorted(r["step"] for r in events if r.get("event") == "rollback")
  last = len(rows)
  stop_reason = "end of the run"
  if until is not None:
    if until < 1:
      raise ReplayError(f"--until must be a step >= 1, not {until}")
    if until < last:
      last, stop_reason = until, f"--until {until}"
  if rollbacks and rollbacks[0] < last:
    last = rollbacks[0]
    stop_reason = (
      f"shadow rollback after step {last}: the parameters were replaced from a shadow "
      "there, outside the update"
    )

  summary_path = workdir / "summary.json"
  if summary_path.exists():
    # The same mesh or no bit-exactness: a run over several processes (configured by
    # environment variables, so not in config.json) or on another device count.
    ran_on = json.loads(summary_path.read_text()).get("devices")
    here = [str(d) for d in jax.devices()]
    if ran_on is not None and len(ran_on) != len(here):
      raise ReplayError(
        f"{workdir} ran on {len(ran_on)} devices and this process has {len(here)}: replay "
        "needs the run's device count in one process (a multi-process run cannot be replayed)"
      )
  s = make_setup(cfg)
  learner = learner_class(cfg.rl.algorithm, s.policy).update_side(s)
  state = _start_state(s, learner, workdir)
  # Read-only: replay never edits the run (a writer's manager would create the directory and
  # clean up the run's unfinished snapshots).
  rl_dir = workdir / "checkpoints" / "rl"
  mngr = ckpt_lib.reader(rl_dir) if rl_dir.is_dir() else None
  snaps = set(mngr.all_steps()) if mngr else set()
  start_equal = None
  if 0 in snaps:
    snap0, _ = ckpt_lib.restore_state(mngr, state, 0)
    start_equal = _params_equal(snap0.params, state.params)
  store = _RecordStore(journal)
  tree = _lineage_tree(workdir, cfg)
  results: list[StepResult] = []
  bar = tqdm.tqdm(total=last, desc="replay", disable=not show_progress, dynamic_ncols=True)
  batch = None
  for row in rows[:last]:
    step = row["step"]
    items = [Item(store.take(i), 0, None) for i in row["applied"]]
    for i in row["stale"]:
      store.take(i)  # dropped as too stale: consumed, never in a batch
    if not items:
      raise ReplayError(f"ledger step {step} applied no record")
    if tree is not None:  # ages along the lineage tree, as the run measured them
      known = tree.known(int(row.get("lineage") or "-1", 16))
      tree.current = int(row["lineage"], 16) if known else None
      learner.lineage = tree if known else None
    batch, _ = learner.batch_from(items, step - 1)
    state, metrics = learner.progs.update(state, learner.progs.shard_batch(batch))
    metrics = jax.device_get(metrics)
    got = {
      "loss": float(metrics["loss"]),
      "grad_norm": float(metrics["grad_norm"]),
      "digest": int(jax.device_get(learner.progs.digest(state.params))),
    }
    want = {k: row["check"][k] for k in FIELDS}
    res = StepResult(step, {k: _same(got[k], want[k]) for k in FIELDS}, got, want)
    if step in snaps:
      like = learner.progs.init(jax.random.key(0))
      snap, _ = ckpt_lib.restore_state(mngr, like, step)
      res.snapshot_equal = _params_equal(snap.params, state.params)
    results.append(res)
    bar.update(1)
    if not res.ok:
      bar.set_postfix_str(f"mismatch at step {step}")
  bar.close()
  if mngr:
    mngr.close()

  bad = [r for r in results if not r.ok]
  first = bad[0] if bad else None
  report = {
    "workdir": str(workdir),
    "algorithm": cfg.rl.algorithm,
    "steps_in_run": len(rows),
    "steps_replayed": len(results),
    "stopped": stop_reason,
    "all_equal": not bad and start_equal is not False,
    "start_equal_to_snapshot_0": start_equal,
    "mismatched_steps": len(bad),
    "first_mismatch": None
    if first is None
    else {
      "step": first.step,
      "fields": [k for k, v in first.equal.items() if not v]
      + (["snapshot_params"] if first.snapshot_equal is False else []),
      "replayed": first.replayed,
      "recorded": first.recorded,
    },
    "snapshots_compared": sorted(r.step for r in results if r.snapshot_equal is not None),
    "snapshots_equal": all(r.snapshot_equal is not False for r in results),
    "devices": [str(d) for d in jax.devices()],
    "seconds": round(time.time() - t0, 2),
    "steps": [
      {"step": r.step, "ok": r.ok, **{f"{k}_equal": v for k, v in r.equal.items()}}
      | {"replayed": {k: r.replayed[k] for k in ("loss", "grad_norm")}}
      | ({"snapshot_equal": r.snapshot_equal} if r.snapshot_equal is not None else {})
      for r in results
    ],
  }
  out.mkdir(parents=True, exist_ok=True)
  if until is not None and results:
    at = results[-1].step
    save_dir = out / "state"
    save_mngr = ckpt_lib.manager(save_dir, every=1, keep=1, keep_best=False)
    ckpt_lib.save(
      save_mngr, state, cfg, {"phase": "replay", "replayed_from": str(workdir)}, force=True
    )
    save_mngr.wait_until_finished()
    save_mngr.close()
    np.savez(out / f"batch_{at}.npz", **_batch_arrays(batch))
    report["state_at_until"] = {"step": at, "snapshot": str(save_dir / str(at))}
    report["batch_at_until"] = str(out / f"batch_{at}.npz")
  (out / "replay.json").write_text(json.dumps(report, indent=2))
  report["report"] = str(out / "replay.json")
  return report


def format_report(report: dict) -> str:
  lines = [
    f"replayed {report['steps_replayed']} of {report['steps_in_run']} updates of "
    f"{report['workdir']} ({report['algorithm']}; stopped: {report['stopped']}) "
    f"in {report['seconds']:.1f} s",
  ]
  start = report["start_equal_to_snapshot_0"]
  if start is not None:
    lines.append(f"start state vs snapshot 0: {'bit-identical' if start else 'DIFFERENT'}")
  lines.append(
    f"snapshots compared: {report['snapshots_compared'] or 'none kept in range'} "
    f"({'all bit-identical' if report['snapshots_equal'] else 'SOME DIFFER'})"
  )
  if report["all_equal"]:
    lines.append("every replayed update: loss, gradient norm and parameters bit-identical")
  else:
    f = report["first_mismatch"]
    if f is None:
      lines.append("the rebuilt start state differs from snapshot 0")
    else:
      lines.append(
        f"{report['mismatched_steps']} updates differ; the first at step {f['step']}: "
        f"{', '.join(f['fields'])} (replayed {f['replayed']}, recorded {f['recorded']})"
      )
  if "state_at_until" in report:
    lines.append(
      f"state after step {report['state_at_until']['step']}: "
      f"{report['state_at_until']['snapshot']}; its batch: {report['batch_at_until']}"
    )
  lines.append(f"report: {report['report']}")
  return "\n".join(lines)
