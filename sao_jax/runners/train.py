"""Single-process trainer: supervised warm start, then synchronous GRPO(N=group_size).

`run(cfg, workdir)` is what `sao-jax train` calls. Phases write to one workdir:
metrics.jsonl (phase-tagged rows), tb/, checkpoints/{sft,rl}/ and summary.json.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import time
import zlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from sao_jax import checkpoint as ckpt_lib
from sao_jax import config as config_lib
from sao_jax.config import Config
from sao_jax.data.arithmetic_tfds import load_tasks
from sao_jax.envs.arithmetic import ArithmeticEnv, ArithmeticSpec
from sao_jax.envs.base import Task
from sao_jax.learner import TrainState, make_optimizer, make_rl_update, make_sft_update
from sao_jax.metrics import MetricsWriter, peak_memory_mb, write_summary
from sao_jax.models import make_model
from sao_jax.models.transformer import TransformerLM
from sao_jax.runners.batching import encode_prompts, encode_targets, round_up
from sao_jax.runners.compiled import Programs, compile_programs
from sao_jax.tokenizer import Tokenizer, get_tokenizer


@dataclasses.dataclass
class Setup:
  """Everything a phase needs that does not change during the run."""

  cfg: Config
  tok: Tokenizer
  model: TransformerLM
  train: list[Task]
  test: list[Task]
  env: ArithmeticEnv
  prompt_len: int
  target_len: int


def task_specs(cfg: Config) -> list[ArithmeticSpec]:
  t = cfg.task
  return [ArithmeticSpec(n_ops=n, max_operand=t.max_operand, ops=t.ops,
                         reverse_digits=t.reverse_digits) for n in (t.n_ops_mix or (t.n_ops,))]


def _interleave(parts: list[list[Task]]) -> list[Task]:
  return [t for group in zip(*parts, strict=True) for t in group]


def make_setup(cfg: Config) -> Setup:
  tok = get_tokenizer(cfg.tokenizer)
  specs = task_specs(cfg)
  parts = len(specs)
  kw = dict(num_train=cfg.task.num_train // parts, num_test=cfg.task.num_test // parts,
            seed=cfg.task.seed, data_dir=cfg.task.data_dir or None)
  # A mixture interleaves its parts, so any prefix of the test split (eval.num_problems)
  # holds every part in equal measure.
  train = _interleave([load_tasks(spec, "train", **kw) for spec in specs])
  test = _interleave([load_tasks(spec, "test", **kw) for spec in specs])
  prompt_len = round_up(1 + max(len(t.prompt) for t in train + test), 8)
  target_len = 1 + max(len(t.solution) for t in train + test)
  if prompt_len + max(target_len, cfg.rl.max_new_tokens) > cfg.model.max_len:
    raise config_lib.ConfigError(
        f"model.max_len {cfg.model.max_len} < prompt {prompt_len} + completion "
        f"{max(target_len, cfg.rl.max_new_tokens)} tokens")
  if cfg.rl.max_new_tokens < target_len:
    raise config_lib.ConfigError(f"rl.max_new_tokens {cfg.rl.max_new_tokens} cannot hold the "
                                 f"longest solution ({target_len} tokens with EOS)")
  model_cfg = dataclasses.replace(cfg.model, vocab_size=cfg.model.vocab_size or tok.vocab_size)
  return Setup(cfg=cfg, tok=tok, model=make_model(model_cfg), train=train, test=test,
               env=ArithmeticEnv(tok), prompt_len=prompt_len, target_len=target_len)


def log_step(writer: MetricsWriter, clock: PhaseClock, cfg: Config, step: int, params,
             row: dict, phase: str):
  """Adds a periodic held-out eval to `row` when due, writes it every `log_every` steps (and
  whenever it carries an eval), and advances the progress bar."""
  row.update(clock.maybe_eval(step, params))
  if step % cfg.log_every == 0 or "eval_accuracy" in row:
    writer.write(step, row, phase=phase, advance=0)
  writer.tick()


def finish_phase(mngr, state: TrainState, cfg: Config, clock: PhaseClock, step: int,
                 phase: str, meta: dict | None = None) -> dict:
  """Final snapshot, then the final held-out eval; returns the phase's common summary."""
  ckpt_lib.save(mngr, state, cfg, meta or {"phase": phase}, force=True)
  mngr.wait_until_finished()
  mngr.close()
  seconds = clock.elapsed
  final = clock.maybe_eval(step, state.params, force=True)
  return {"steps": step, "seconds": seconds, "eval_curve": clock.curve,
          **{k.removeprefix("eval_"): v for k, v in final.items()}}


def delay_stats(delays: list[float]) -> dict:
  d = np.asarray(delays or [0.0])
  return {"delay_mean_s": float(d.mean()), "delay_p95_s": float(np.percentile(d, 95))}


def copy_tree(tree):
  """Fresh buffers: the jitted updates donate their input state."""
  return jax.tree.map(jnp.copy, tree)


def programs_for(s: Setup, optim, update_maker, *, with_ref=False, mesh=None,
                 num_tasks: int = 0) -> Programs:
  tx = make_optimizer(optim, 0)
  return compile_programs(s.cfg, s.model, tx, update_maker(s.model, tx), with_ref=with_ref,
                          prompt_len=s.prompt_len, max_new_tokens=s.cfg.rl.max_new_tokens,
                          temperature=s.cfg.rl.temperature, eos_id=s.tok.eos_id,
                          pad_id=s.tok.pad_id, mesh=mesh, num_tasks=num_tasks)


def make_env(s: Setup) -> ArithmeticEnv:
  return ArithmeticEnv(s.tok)


def score(s: Setup, tasks: list[Task], tokens_bt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Rewards and format flags from the environment, one episode per row."""
  rewards = np.zeros(len(tasks), np.float32)
  fmt = np.zeros(len(tasks), bool)
  for i, task in enumerate(tasks):
    s.env.reset(task)
    res = s.env.step(tokens_bt[i])
    rewards[i], fmt[i] = res.reward, res.info["format_ok"]
  return rewards, fmt


def evaluate(s: Setup, progs: Programs, params, num: int | None = None,
             tasks: list[Task] | None = None) -> dict[str, float]:
  """Held-out greedy accuracy on the first `num` test problems (exact final answer), or on
  `tasks` (e.g. the validation problems of shadow models)."""
  tasks = s.test[:num or s.cfg.eval.num_problems] if tasks is None else tasks
  bs = round_up(min(s.cfg.eval.batch_size, len(tasks)), progs.batch_divisor)
  correct, fmt = [], []
  for i in range(0, len(tasks), bs):
    chunk = tasks[i:i + bs]
    padded = chunk + [chunk[-1]] * (bs - len(chunk))
    prompt, pvalid = encode_prompts(s.tok, [t.prompt for t in padded], s.prompt_len)
    out = progs.greedy(params, prompt, pvalid, jax.random.key(0))
    r, f = score(s, chunk, np.asarray(out.tokens_bt)[:len(chunk)])
    correct.append(r)
    fmt.append(f)
  correct, fmt = np.concatenate(correct), np.concatenate(fmt)
  return {"accuracy": float(correct.mean()), "format_rate": float(fmt.mean()),
          "num_problems": len(tasks)}


class PhaseClock:
  """Training wall-clock of a phase, excluding held-out evaluation, so that time budgets and
  accuracy-vs-time curves compare arms on training time alone."""

  def __init__(self, steps: int, max_seconds: float, eval_every: float, eval_fn):
    self.steps, self.max_seconds = steps, max_seconds
    self.eval_every, self.eval_fn = eval_every, eval_fn
    self.t0 = time.time()
    self.eval_seconds = 0.0
    self.last_eval = 0.0
    self.curve: list[tuple[float, int, float]] = []  # (train seconds, step, eval accuracy)

  def resume_at(self, seconds: float) -> None:
    """Continues a phase that already trained `seconds` before a restart."""
    self.t0 = time.time() - seconds - self.eval_seconds

  @property
  def elapsed(self) -> float:
    return time.time() - self.t0 - self.eval_seconds

  def running(self, step: int) -> bool:
    if self.steps and step >= self.steps:
      return False
    return not (self.max_seconds and self.elapsed >= self.max_seconds)

  def maybe_eval(self, step: int, params, force: bool = False) -> dict[str, float]:
    """Held-out eval every `eval_every` training seconds (and at step 0 / the end)."""
    if not (force or (self.eval_every and self.elapsed - self.last_eval >= self.eval_every)):
      return {}
    te = time.time()
    result = self.eval_fn(params)
    self.eval_seconds += time.time() - te
    self.last_eval = self.elapsed
    self.curve.append((round(self.elapsed, 2), step, result["accuracy"]))
    return {f"eval_{k}": v for k, v in result.items()}


def run_sft(s: Setup, writer: MetricsWriter, state: TrainState | None, workdir: pathlib.Path,
            *, steps: int | None = None, max_seconds: float | None = None, tag: str = "sft",
            eval_every: float = 0.0, keep_opt_state: bool = False
            ) -> tuple[TrainState, Programs, dict]:
  """Teacher-forced cross-entropy on worked solutions of random training problems.

  Starts from `state`'s params (a copy: the caller's state stays valid) and, with
  `keep_opt_state`, its optimizer state too (continuing an SFT run rather than restarting).
  """
  cfg = s.cfg
  steps = cfg.sft.steps if steps is None else steps
  max_seconds = cfg.sft.max_seconds if max_seconds is None else max_seconds
  progs = programs_for(s, cfg.sft.optim, make_sft_update)
  fresh = progs.init(jax.random.key(cfg.seed))
  if state is not None:
    state = copy_tree(state) if keep_opt_state else fresh.replace(params=copy_tree(state.params))
  else:
    state = fresh
  bs = round_up(cfg.sft.batch_size, progs.batch_divisor)
  rng = np.random.default_rng((cfg.seed, 1, zlib.crc32(tag.encode())))
  clock = PhaseClock(steps, max_seconds, eval_every,
                     lambda params: evaluate(s, progs, params))
  writer.progress(tag, steps or None)
  mngr = ckpt_lib.manager(workdir / "checkpoints" / tag, every=cfg.checkpoint_every,
                          keep=cfg.recovery.keep, keep_best=False)
  step, tokens = 0, 0
  resumed = ckpt_lib.restore_latest_valid(mngr, state) if mngr.all_steps() else None
  if resumed is not None:  # a restart: same batches from here as the uninterrupted run
    state, meta, step, _ = resumed
    rng.bit_generator.state = meta["stream"]["rng"]
    clock.resume_at(meta["stream"]["train_seconds"])
    print(f"{tag}: resuming from snapshot step {step}", flush=True)
  else:
    clock.maybe_eval(step, state.params, force=bool(eval_every))

  def meta():
    return {"phase": tag, "stream": {"rng": rng.bit_generator.state,
                                     "train_seconds": clock.elapsed}}

  while clock.running(step):
    ts = time.time()
    idx = rng.integers(0, len(s.train), bs)
    tasks = [s.train[i] for i in idx]
    prompt, pvalid = encode_prompts(s.tok, [t.prompt for t in tasks], s.prompt_len)
    target, tvalid = encode_targets(s.tok, [t.solution for t in tasks], s.target_len)
    batch = progs.shard_batch({"prompt": prompt, "prompt_valid": pvalid, "tokens": target,
                               "valid": tvalid})
    state, metrics = progs.update(state, batch)
    step += 1
    tokens += int(tvalid.sum())
    ckpt_lib.save(mngr, state, cfg, meta())
    row = {}
    if step % cfg.log_every == 0:  # fetching metrics waits for the step: only when logged
      dt = time.time() - ts
      row = dict(jax.device_get(metrics), step_time=dt, learner_time=dt,
                 train_seconds=clock.elapsed, tokens_per_s=tokens / max(clock.elapsed, 1e-9),
                 peak_memory_mb=peak_memory_mb())
    log_step(writer, clock, cfg, step, state.params, row, tag)
  return state, progs, finish_phase(mngr, state, cfg, clock, step, tag, meta())


def run_grpo(s: Setup, writer: MetricsWriter, state: TrainState, workdir: pathlib.Path, *,
             max_seconds: float | None = None, eval_every: float = 0.0
             ) -> tuple[TrainState, Programs, dict]:
  """Synchronous GRPO: sample G completions for each of `prompts_per_step` prompts, wait for
  all of them, score, one update; repeat. The 'Traditional' row of the seed's table."""
  cfg, rl = s.cfg, s.cfg.rl
  max_seconds = rl.max_seconds if max_seconds is None else max_seconds
  with_ref = rl.kl_coef > 0
  progs = programs_for(s, rl.optim, lambda m, tx: make_rl_update(m, tx, rl), with_ref=with_ref)
  fresh = progs.init(jax.random.key(cfg.seed + 1))
  state = fresh.replace(params=copy_tree(state.params),
                        ref_params=copy_tree(state.params) if with_ref else None)
  rows = rl.prompts_per_step * rl.group_size
  if rows % progs.batch_divisor:
    raise config_lib.ConfigError(f"prompts_per_step*group_size = {rows} must divide over "
                                 f"{progs.batch_divisor} batch shards")
  rng = np.random.default_rng((cfg.seed, 2))
  key = jax.random.key(cfg.seed + 2)
  mngr = ckpt_lib.manager(workdir / "checkpoints" / "rl", every=cfg.checkpoint_every,
                          keep=cfg.recovery.keep, keep_best=False)
  clock = PhaseClock(rl.steps, max_seconds, eval_every,
                     lambda params: evaluate(s, progs, params))
  writer.progress("grpo", rl.steps or None)
  step, busy, tokens, delays = 0, 0.0, 0, []
  resumed = ckpt_lib.restore_latest_valid(mngr, state) if mngr.all_steps() else None
  if resumed is not None:
    state, meta, step, _ = resumed
    rng.bit_generator.state = meta["stream"]["rng"]
    key = jax.random.wrap_key_data(np.asarray(meta["stream"]["key"], np.uint32))
    clock.resume_at(meta["stream"]["train_seconds"])
    print(f"grpo: resuming from snapshot step {step}", flush=True)
  else:
    clock.maybe_eval(step, state.params, force=bool(eval_every))

  def meta():
    return {"phase": "rl", "stream": {"rng": rng.bit_generator.state,
                                      "key": np.asarray(jax.random.key_data(key)).tolist(),
                                      "train_seconds": clock.elapsed}}

  t_loop = time.time()
  while clock.running(step):
    ts = time.time()
    idx = rng.integers(0, len(s.train), rl.prompts_per_step)
    tasks = [s.train[i] for i in idx for _ in range(rl.group_size)]
    prompt, pvalid = encode_prompts(s.tok, [t.prompt for t in tasks], s.prompt_len)
    key, sub = jax.random.split(key)
    out = jax.device_get(progs.sample(state.params, prompt, pvalid, sub))
    rewards, fmt = score(s, tasks, out.tokens_bt)
    t_sampled = time.time()
    batch = progs.shard_batch({"prompt": prompt, "prompt_valid": pvalid,
                               "tokens": out.tokens_bt, "valid": out.valid_bt,
                               "logp": out.logp_bt, "rewards": rewards})
    tu = time.time()
    for _ in range(rl.ppo_epochs):
      state, metrics = progs.update(state, batch)
    metrics = jax.device_get(metrics)
    busy += time.time() - tu
    tokens += int(out.lengths_b.sum())
    delays.append(time.time() - t_sampled)  # every row of the group waited for the last one
    step += 1
    ckpt_lib.save(mngr, state, cfg, meta())
    t_end = time.time()
    row = dict(metrics, accuracy=float(rewards.mean()), format_rate=float(fmt.mean()),
               step_time=t_end - ts, sampling_time=t_sampled - ts, learner_time=t_end - t_sampled,
               tokens_per_s=float(out.lengths_b.sum()) / (t_end - ts),
               mean_len=float(out.lengths_b.mean()), train_seconds=clock.elapsed,
               learner_busy=busy / (time.time() - t_loop), peak_memory_mb=peak_memory_mb())
    log_step(writer, clock, cfg, step, state.params, row, "rl")
  wall = time.time() - t_loop
  info = finish_phase(mngr, state, cfg, clock, step, "rl", meta())
  return state, progs, dict(info, trajectories=step * rows, trajectories_per_s=step * rows / wall,
                            tokens_per_s=tokens / wall, learner_busy=busy / wall,
                            peak_rss_all_mb=peak_memory_mb(), **delay_stats(delays))


def restore_init(s: Setup, path: str):
  """Params from another run's latest checkpoint (a workdir or a checkpoint folder)."""
  directory = _checkpoint_dir(pathlib.Path(path))
  progs = programs_for(s, s.cfg.sft.optim, make_sft_update)
  like = progs.init(jax.random.key(0))
  params, _, _ = ckpt_lib.restore_params(directory, like.params)
  return like.replace(params=params)


def _checkpoint_dir(path: pathlib.Path) -> pathlib.Path:
  """`path` itself if it holds steps; else the newest phase under path/checkpoints."""
  if (path / "checkpoints").is_dir():
    for phase in ("rl", "sft"):
      d = path / "checkpoints" / phase
      if d.is_dir() and any(p.name.isdigit() for p in d.iterdir()):
        return d
    raise FileNotFoundError(f"no checkpoints under {path}/checkpoints")
  return path


def _eval_row(info: dict) -> dict:
  return {f"eval_{k}": info[k] for k in ("accuracy", "format_rate", "num_problems") if k in info}


def _check_resume(cfg: Config, workdir: pathlib.Path) -> dict | None:
  """None for a new workdir; for one that holds this run: the phases it finished (rerunning
  the same command resumes). A different config in the same workdir is an error."""
  old_path = workdir / "config.json"
  if not (workdir / "checkpoints").exists() or not old_path.exists():
    return None
  try:  # keys added to the code since (absent from the file) take their defaults
    old_cfg = config_lib.from_dict(json.loads(old_path.read_text()))
  except (config_lib.ConfigError, TypeError, ValueError) as err:
    raise config_lib.ConfigError(f"{workdir} holds a run whose config.json this code cannot "
                                 f"read ({err}); pass a new --workdir") from None
  old = _flat(json.loads(config_lib.to_json(old_cfg)))
  new = _flat(json.loads(config_lib.to_json(cfg)))
  diff = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
  if diff:
    shown = "; ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in diff[:5])
    raise config_lib.ConfigError(
        f"{workdir} already holds a run with a different config ({shown}); rerun with the same "
        "config to resume it, or pass a new --workdir")
  path = workdir / "progress.json"
  progress = json.loads(path.read_text()) if path.exists() else {}
  return progress


def _flat(d: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flat(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def _save_progress(workdir: pathlib.Path, phase: str, info: dict) -> None:
  path = workdir / "progress.json"
  progress = json.loads(path.read_text()) if path.exists() else {}
  progress[phase] = {k: v for k, v in info.items() if k != "eval_curve"}
  tmp = path.with_suffix(".tmp")
  tmp.write_text(json.dumps(progress, default=float))
  os.replace(tmp, path)


def run(cfg: Config, workdir: str | pathlib.Path, *, show_progress: bool = True) -> dict[str, Any]:
  workdir = pathlib.Path(workdir)
  progress = _check_resume(cfg, workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / "config.json").write_text(config_lib.to_json(cfg))
  t_start = time.time()
  s = make_setup(cfg)
  writer = MetricsWriter(workdir, show_progress=show_progress)
  summary: dict[str, Any] = {"name": cfg.name, "devices": [str(d) for d in jax.devices()],
                             "train_problems": len(s.train), "test_problems": len(s.test)}
  if progress is not None:
    print(f"resuming the run in {workdir} (finished phases: {', '.join(progress) or 'none'})",
          flush=True)
    if (workdir / "summary.json").exists() and ("rl" in progress or not (
        cfg.rl.steps or cfg.rl.max_seconds)):
      writer.close()
      print("the run had already finished; its summary is unchanged", flush=True)
      return json.loads((workdir / "summary.json").read_text())
  progress = progress or {}
  state = restore_init(s, cfg.init_from) if cfg.init_from else None
  try:
    if "sft" in progress:  # finished before the restart: its final snapshot is the start
      state = restore_init(s, str(workdir / "checkpoints" / "sft"))
      summary["sft"] = progress["sft"]
    elif cfg.sft.steps or cfg.sft.max_seconds:
      state, progs, info = run_sft(s, writer, state, workdir, eval_every=cfg.eval.every_seconds)
      summary["sft"] = info
      writer.write(info["steps"], _eval_row(info), phase="sft_eval", advance=0)
      _save_progress(workdir, "sft", info)
    if state is None:
      raise config_lib.ConfigError("nothing to train from: set sft.steps/max_seconds or init_from")
    if cfg.rl.steps or cfg.rl.max_seconds:
      if "sft" not in summary:
        progs = programs_for(s, cfg.sft.optim, make_sft_update)
        summary["start"] = evaluate(s, progs, state.params)
      if cfg.rl.algorithm == "sao":
        from sao_jax.runners.sao import run_sao
        state, progs, info = run_sao(s, writer, state, workdir, eval_every=cfg.eval.every_seconds)
      else:
        state, progs, info = run_grpo(s, writer, state, workdir,
                                      eval_every=cfg.eval.every_seconds)
      summary["rl"] = info
      writer.write(info["steps"], _eval_row(info), phase="rl_eval", advance=0)
      _save_progress(workdir, "rl", info)
  finally:
    writer.close()
  summary["wall_s"] = time.time() - t_start
  summary["peak_memory_mb"] = peak_memory_mb()
  write_summary(workdir, summary)
  return summary


def eval_workdir(workdir: str | pathlib.Path, num: int | None = None) -> dict[str, Any]:
  """Held-out greedy accuracy of the latest checkpoint in `workdir`, rebuilt from its config."""
  directory = _checkpoint_dir(pathlib.Path(workdir))
  step, meta = ckpt_lib.read_meta(directory)
  cfg = config_lib.from_dict(meta["config"])
  s = make_setup(cfg)
  progs = programs_for(s, cfg.sft.optim, make_sft_update)
  params, _, _ = ckpt_lib.restore_params(directory, progs.init(jax.random.key(0)).params)
  result = evaluate(s, progs, params, num)
  return dict(result, checkpoint=str(directory), step=step)
