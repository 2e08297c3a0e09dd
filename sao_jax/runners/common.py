"""What every training phase shares: its clock, its programs, its logging and its ending."""

from __future__ import annotations

import functools
import pathlib
import time
from collections.abc import Callable

import flax.serialization
import jax
import numpy as np

from sao_jax import checkpoint as ckpt_lib
from sao_jax import distributed, interrupt, sharding, stats
from sao_jax.config import Config, OptimConfig
from sao_jax.envs.base import Task
from sao_jax.evaluation import evaluate
from sao_jax.learner import make_optimizer
from sao_jax.metrics import MetricsWriter, peak_memory_mb
from sao_jax.runners.compiled import (
  Programs,
  SamplerPrograms,
  compile_learner,
  compile_sampler,
  programs_of,
)
from sao_jax.setup import Setup
from sao_jax.state import TrainState


class PhaseClock:
  """Training wall-clock of a phase, excluding held-out evaluation, so that time budgets and
  accuracy-vs-time curves compare arms on training time alone.

  With `defer_dir` (`eval.deferred`), a periodic eval only writes the parameters there, and
  `run_deferred` evaluates them after the phase: nothing that runs beside the learner (SAO's
  samplers) goes on working while the clock is stopped for an eval, so an arm's training
  seconds buy it the same work however often it is evaluated. The phase's closing eval is
  made at once either way."""

  def __init__(
    self,
    steps: int,
    max_seconds: float,
    eval_every: float,
    eval_fn,
    eval_every_steps: int = 0,
    defer_dir: pathlib.Path | None = None,
  ):
    self.steps, self.max_seconds = steps, max_seconds
    self.eval_every, self.eval_fn = eval_every, eval_fn
    self.eval_every_steps = eval_every_steps
    self.t0 = time.time()
    self.eval_seconds = 0.0
    self.last_eval = 0.0
    self.curve: list[tuple[float, int, float]] = []  # (train seconds, step, eval accuracy)
    self.defer_dir = defer_dir
    self.deferred: list[tuple[float, int, pathlib.Path]] = []  # (train seconds, step, params)

  def resume_at(self, seconds: float) -> None:
    """Continues a phase that already trained `seconds` before a restart."""
    self.t0 = time.time() - seconds - self.eval_seconds

  @property
  def elapsed(self) -> float:
    return time.time() - self.t0 - self.eval_seconds

  def running(self, step: int) -> bool:
    """Whether to take update `step` + 1. Decisions from the wall clock are process 0's in
    every process (`distributed.agree`): a multi-host learner's processes must stop, and
    evaluate, at the same steps. A Ctrl-C waiting for a step boundary (`interrupt`) is
    raised here."""
    interrupt.check()
    if self.steps and step >= self.steps:
      return False
    return not (self.max_seconds and distributed.agree(self.elapsed >= self.max_seconds))

  def maybe_eval(
    self, step: int, params, force: bool = False, final: bool = False
  ) -> dict[str, float]:
    """Held-out eval every `eval_every` training seconds and/or every `eval_every_steps`
    steps (and at step 0 / the end: `final`). The last step of a step budget is left to the
    phase's closing eval, so that step is not evaluated twice. Steps are the same in every
    process; the wall clock is process 0's (`distributed.agree`). Deferred (`defer_dir`),
    an eval that is not `final` saves `params` and returns nothing."""
    k = self.eval_every_steps
    by_step = k and step % k == 0 and not (self.steps and step >= self.steps)
    if not (
      force
      or final
      or by_step
      or (self.eval_every and distributed.agree(self.elapsed - self.last_eval >= self.eval_every))
    ):
      return {}
    te = time.time()
    if self.defer_dir is not None and not final:
      self.defer_dir.mkdir(parents=True, exist_ok=True)
      path = self.defer_dir / f"{len(self.deferred):05d}.msgpack"
      path.write_bytes(flax.serialization.to_bytes(jax.device_get(params)))
      self.eval_seconds += time.time() - te
      self.last_eval = self.elapsed
      self.deferred.append((round(self.elapsed, 2), step, path))
      return {}
    result = self.eval_fn(params)
    self.eval_seconds += time.time() - te
    self.last_eval = self.elapsed
    self.curve.append((round(self.elapsed, 2), step, result["accuracy"]))
    return {f"eval_{k}": v for k, v in result.items()}

  def run_deferred(self, params_like, skip_step: int | None = None) -> None:
    """Evaluates the parameters deferred evals saved (`params_like`: a tree of the same
    structure), in order, into `curve`; removes their files. One saved at `skip_step` (the
    phase's last step, which its closing eval evaluates anyway) is not evaluated twice."""
    for seconds, step, path in self.deferred:
      if step == skip_step:
        path.unlink()
        continue
      params = flax.serialization.from_bytes(params_like, path.read_bytes())
      te = time.time()
      result = self.eval_fn(params)
      self.eval_seconds += time.time() - te
      self.curve.append((seconds, step, result["accuracy"]))
      path.unlink()
    self.deferred.clear()
    self.curve.sort(key=lambda point: point[0])


def programs_for(
  s: Setup,
  optim: OptimConfig,
  update_maker: Callable,
  *,
  with_ref=False,
  mesh=None,
  num_tasks: int = 0,
) -> Programs:
  """The phase's learner (init, `update_maker(s.policy.learner_model, tx)`) and sampler
  programs of the run's policy; the sampler is compiled once per run and shared by its
  phases where the policy is the same object (`shared_sampler`)."""
  policy = s.policy
  mesh = mesh or sharding.make_mesh(s.cfg.mesh)
  tx = policy.trainable(make_optimizer(optim))
  learner = compile_learner(
    s.cfg,
    policy,
    tx,
    update_maker(policy.learner_model, tx),
    with_ref=with_ref,
    mesh=mesh,
    num_tasks=num_tasks,
  )
  return programs_of(learner, shared_sampler(s.cfg, policy, s.tok.eos_id, s.tok.pad_id, mesh))


def sft_programs(s: Setup) -> Programs:
  """`programs_for` the supervised phase: the run's policy's SFT update."""
  return programs_for(s, s.cfg.sft.optim, lambda _, tx: s.policy.sft_update(tx, s.cfg))


@functools.lru_cache(maxsize=2)
def shared_sampler(cfg: Config, policy, eos_id: int, pad_id: int, mesh=None) -> SamplerPrograms:
  """`policy`'s sampler programs, compiled once for every phase of a run that uses it."""
  return compile_sampler(
    cfg,
    policy,
    max_new_tokens=cfg.rl.max_new_tokens,
    temperature=cfg.rl.temperature,
    eos_id=eos_id,
    pad_id=pad_id,
    mesh=mesh,
  )


def eval_fn(s: Setup, progs: Programs, tasks: list[Task] | None = None):
  """params -> held-out metrics dict (`evaluation.evaluate`, on `tasks`, default the test
  split's first eval.num_problems)."""
  return lambda params: evaluate(s, progs, params, batch_divisor=progs.batch_divisor, tasks=tasks)


def phase_manager(cfg: Config, workdir: pathlib.Path, name: str):
  """The snapshots of a synchronous phase, in `workdir/checkpoints/<name>`: one every
  `checkpoint_every` steps, the last `recovery.keep` kept (and committed to the bucket, with
  `storage.url`)."""
  return ckpt_lib.manager(
    workdir / "checkpoints" / name,
    every=cfg.checkpoint_every,
    keep=cfg.recovery.keep,
    keep_best=False,
    remote=ckpt_lib.snapshot_url(cfg, name),
  )


def defer_dir(cfg: Config, workdir: pathlib.Path, tag: str) -> pathlib.Path | None:
  """Where a phase's deferred evals keep their parameters (`eval.deferred`), else None."""
  return pathlib.Path(workdir) / "deferred_eval" / tag if cfg.eval.deferred else None


def phase_meta(phase: str, rng: np.random.Generator, clock: PhaseClock, key=None) -> dict:
  """What a synchronous phase stores with each snapshot besides its state: the numpy stream,
  the jax key when it draws from one, and the training seconds so far (`resume_phase`)."""
  stream = {"rng": rng.bit_generator.state}
  if key is not None:
    stream["key"] = np.asarray(jax.random.key_data(key)).tolist()
  stream["train_seconds"] = clock.elapsed
  return {"phase": phase, "stream": stream}


def resume_phase(
  mngr,
  state: TrainState,
  clock: PhaseClock,
  rng: np.random.Generator,
  name: str,
  *,
  with_key: bool = False,
) -> tuple[TrainState, int, jax.Array | None] | None:
  """Continues a synchronous phase from its newest valid snapshot, so that it draws the
  batches the uninterrupted run would have: (state, step, and with `with_key` the jax key
  saved by `phase_meta`, else None), with `rng` and `clock` set back in place; None when
  there is nothing to resume."""
  resumed = ckpt_lib.restore_latest_valid(mngr, state) if mngr.all_steps() else None
  if resumed is None:
    return None
  state, meta, step, _ = resumed
  rng.bit_generator.state = meta["stream"]["rng"]
  key = None
  if with_key:
    key = jax.random.wrap_key_data(np.asarray(meta["stream"]["key"], np.uint32))
  clock.resume_at(meta["stream"]["train_seconds"])
  print(f"{name}: resuming from snapshot step {step}", flush=True)
  return state, step, key


def supervised_row(
  cfg: Config, step: int, metrics, ts: float, tokens: int, clock: PhaseClock
) -> dict:
  """The log row of a supervised step that started at `ts` (after `tokens` target tokens in
  all): every `log_every` steps, else empty, as fetching the metrics waits for the step."""
  if step % cfg.log_every != 0:
    return {}
  dt = time.time() - ts
  return dict(
    jax.device_get(metrics),
    step_time=dt,
    learner_time=dt,
    train_seconds=clock.elapsed,
    tokens_per_s=tokens / max(clock.elapsed, 1e-9),
    peak_memory_mb=peak_memory_mb(),
  )


def log_step(
  writer: MetricsWriter, clock: PhaseClock, cfg: Config, step: int, params, row: dict, phase: str
):
  """Adds a periodic held-out eval to `row` when due, writes it every `log_every` steps (and
  whenever it carries an eval), and advances the progress bar."""
  row.update(clock.maybe_eval(step, params))
  if step % cfg.log_every == 0 or "eval_accuracy" in row:
    writer.write(step, row, phase=phase, advance=0)
  writer.tick()


def finish_phase(
  mngr,
  state: TrainState,
  cfg: Config,
  clock: PhaseClock,
  step: int,
  phase: str,
  meta: dict | None = None,
  packer=None,
) -> dict:
  """Final snapshot, then the final held-out eval; returns the phase's common summary (with
  the sequence packer's counts where the learner packed, `learner.pack='on'`)."""
  ckpt_lib.save(mngr, state, cfg, meta or {"phase": phase}, force=True)
  mngr.wait_until_finished()
  mngr.close()
  seconds = clock.elapsed
  clock.run_deferred(state.params, skip_step=step)
  final = clock.maybe_eval(step, state.params, final=True)
  return {
    "steps": step,
    "seconds": seconds,
    "eval_curve": clock.curve,
    **{k.removeprefix("eval_"): v for k, v in final.items()},
    **({"packing": dict(packer.counts, rows=packer.rows)} if packer is not None else {}),
  }


def length_stats(lengths: list[int]) -> dict:
  """Distribution of completion lengths (tokens per trajectory): the long tail a synchronous
  batch waits for."""
  x = np.asarray(lengths or [0])
  return {
    "length_mean": float(x.mean()),
    "length_cv": float(x.std() / x.mean()) if x.mean() else 0.0,
    "length_p10": float(np.percentile(x, 10)),
    "length_p50": float(np.percentile(x, 50)),
    "length_p90": float(np.percentile(x, 90)),
    "length_max": int(x.max()),
    "length_hist": stats.length_histogram(lengths),
  }


def delay_stats(delays: list[float]) -> dict:
  d = np.asarray(delays or [0.0])
  return {"delay_mean_s": float(d.mean()), "delay_p95_s": float(np.percentile(d, 95))}
