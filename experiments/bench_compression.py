"""Three-stage context compression on long-horizon tasks: bytes, accuracy, peak memory.

1. Bytes per 1,000-step trajectory after each stage (experiments/configs/longhorizon.py
   LONG_TASKS). The episodes are real environment episodes played by the scripted (expert)
   policy, since no policy we can train here plays 1,000 steps; they go step by step through
   the sampler's jitted `compress` program (all three stages in one function) with the
   encoder/LSTM trained in part 2. Reported: the full context as float32 token embeddings at
   the policy width (what a full-context policy holds per layer; its KV cache is 2 x depth
   times that), then stage 1 (m vectors per step, float32), stage 2 (kept steps only),
   stage 3 (INT8 + a float32 scale per vector + an int16 step index per kept step), and on
   their own lines the graveyard that makes the learner's replay exact with eviction (the
   evicted entries, collected as the sampler does, each a stage-3 entry plus an int16
   eviction step; `sao_jax.compression.memory`) and stage 3 with it. Also:
   which facts/keys the final bank kept and which were among the `visible` entries the policy
   saw at their question (replayed with the graveyard), with eviction (the default) and with
   the first-come rule (ablation), and the LSTM's surprise per kind of step.
2. Accuracy at the same training budget: the memory policy (compressed memory + 24-token raw
   window) against the full-context control (same transformer, whole episode as context),
   the same supervised steps on the same expert episodes (teacher forcing; no RL: a policy
   that has to discover recall 32 turns back by RL alone does not learn in minutes on a
   CPU), then greedy rollouts on held-out episodes. The retention task asks every question
   >= 32 turns after its fact: its accuracy is the retention at 32 turns. The memory policy is
   also evaluated with float memory (stage 3 off) to isolate the quantiser's loss. Each
   accuracy comes with its binomial s.e., a 95 % Wilson interval and chance (0.1, a digit);
   the relative loss with the s.e. of the paired per-question difference. Each question the
   compressed arm misses is attributed (`compressed_errors`): was its fact among the
   entries the policy saw when asked (it misread its memory) or not (the filter dropped or
   evicted it); likewise for the questions it lost against the control, with their distance.
   With --uncompressed-control, a third arm: the same memory policy keeping every step's
   stage-1 vectors in float32 (no temporal filter, no INT8; its bank holds the whole
   episode), trained the same way; at 1,000 steps it reads all 1,000 steps. Against it the
   relative loss measures what stages 2 and 3 lose, with a control that trains at this
   budget (the token-level control does not learn many-fact recall here). With
   --no-token-control the token-level control is skipped (e.g. to add this arm to seeds whose
   control is already measured: the compressed arm is the same run, same seed), and so are
   the results that pair with it.
3. Peak memory of one learner update, from XLA's compiled memory analysis
   (`progs.update.lower(...).compile().memory_analysis()`: arguments + outputs + temporaries
   - aliased), for GRPO(N=8) with full context (`sao_jax.learner.make_rl_update`, 8 rows per
   graded step of one task) against SAO with compressed memory (`make_memory_update`, one
   trajectory per task), on the accuracy episodes and on the 1,000-step episodes. Plus the
   stored context bytes of the 8 vs 1 trajectories. It needs no trained parameters:
   --peak-memory-only measures it alone, --skip-peak-memory leaves it out (a later --resume
   run without the flag adds it).

The JSON is written as each part finishes ("complete": false and "done": the last part
finished, until the end), so a run stopped part-way keeps what it measured. With
--params-dir DIR each arm's trained parameters are saved there (Orbax, with checksums) and a
later run with the same settings and DIR restores them instead of training again: a multi-hour
run stopped in its evaluation resumes without retraining (the arm records where its
parameters came from and the CPU they were trained on). With --resume as well, the rerun
also keeps what the stopped run's JSON (--out) already measured, once its settings are
checked to match: a task's short episodes, its bytes and filters, each arm's 1,000-step
accuracy (saved after each arm, with its per-question answers for the paired comparison)
and its peak memory; `resumed_from` records the run it continued.
With --eval-set KEY=VALUE (compression fields only, none that changes the parameters' shapes)
the compressed arm is trained as --set says and measured (short and 1,000-step accuracy, bytes,
filters, peak memory) with the override: e.g. the trained filter at another keep-probability
threshold. With --resume a file measured under other --eval-set values keeps its controls (they
do not read the override) and the compressed arm is measured again, paired with their answers.

Run (default, ~30 min on a shared 2-core CPU; writes results/bench_compression.json):
  python experiments/bench_compression.py
Smoke run (one to two minutes, mostly compilation):
  python experiments/bench_compression.py --config experiments/configs/longhorizon.py:tiny \
      --quick --out /tmp/bench_compression_quick.json
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import pathlib
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from sao_jax import checkpoint as ckpt
from sao_jax import config as config_lib
from sao_jax.batches import MemoryBatch, RLBatch
from sao_jax.compression.arms import LONG_ARM_NAMES, LONG_ARM_OF
from sao_jax.compression.memory import graveyard_nbytes
from sao_jax.compression.rollout import (
  bury,
  episode_tokens,
  gone_record,
  graveyard_arrays,
  script,
  segment,
)
from sao_jax.config import Config, ConfigError, RLConfig, load_config
from sao_jax.envs.longhorizon import BOUNDARIES, SEP, graded_steps, make_split
from sao_jax.learner import make_optimizer, make_rl_update
from sao_jax.models.transformer import TransformerLM
from sao_jax.packing import right_pad
from sao_jax.provenance import cpu, provenance
from sao_jax.results_file import ResultFile, ResultFileError, config_file_id
from sao_jax.runners import memory_lab as L
from sao_jax.runners.compiled import compile_programs
from sao_jax.startup import enable_compile_cache
from sao_jax.stats import wilson

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _parser():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--config", default=str(ROOT / "experiments/configs/longhorizon.py"))
  p.add_argument("--quick", action="store_true", help="smoke run: few steps, short episodes")
  p.add_argument("--steps", type=int, default=0, help="training steps per arm (0: config)")
  p.add_argument(
    "--control-steps",
    type=int,
    default=0,
    help="training steps for the stage-1-only control alone (0: --steps); more than the "
    "compressed arm's gives the control the larger budget (with --params-dir a snapshot at "
    "fewer steps is trained on, not retrained)",
  )
  p.add_argument("--num-test", type=int, default=0, help="held-out episodes (0: 256, quick 8)")
  p.add_argument("--long-episodes", type=int, default=4)
  p.add_argument(
    "--accuracy-only",
    action="store_true",
    help="train and evaluate only (skip bytes per stage and peak memory)",
  )
  p.add_argument("--tasks", default="", help="comma-separated (default: all; quick: retention)")
  p.add_argument("--seed", type=int, default=0, help="model init and training order")
  p.add_argument(
    "--long-eval-episodes",
    type=int,
    default=32,
    help="1,000-step episodes played greedily by each arm (0: skip; quick 2)",
  )
  p.add_argument(
    "--no-attention-cost", action="store_true", help="skip timing the whole bank vs a window"
  )
  p.add_argument(
    "--uncompressed-control",
    action="store_true",
    help="also train and evaluate the memory policy with every step kept in float32 "
    "(stage 1 only): the control for stages 2 and 3",
  )
  p.add_argument(
    "--no-token-control",
    action="store_true",
    help="skip the token-level full-context control and what pairs with it (the compressed "
    "arm and, with --uncompressed-control, the stage-1-only arm still train)",
  )
  p.add_argument(
    "--arms",
    default="",
    help="comma-separated arms to train and measure in this run (default: every arm the "
    "other flags ask for: compressed, full_context unless --no-token-control, "
    "uncompressed_memory with --uncompressed-control); with --resume the others are kept "
    "from --out, so a seed's arms can run one at a time, in separate runs or on separate "
    "machines, into one file",
  )
  p.add_argument(
    "--set",
    action="append",
    default=[],
    metavar="KEY=VALUE",
    help="config override, as for sao-jax train (e.g. sft.optim.lr=3e-4); recorded in the JSON",
  )
  p.add_argument(
    "--eval-set",
    action="append",
    default=[],
    metavar="KEY=VALUE",
    help="compression override for measuring the compressed arm only, not for training it "
    "(e.g. compression.salience_threshold=0.1: the trained filter at a threshold chosen after "
    "training); recorded in the JSON and on the arm. With --params-dir and --resume, a file "
    "measured under other --eval-set values keeps its controls and measures the compressed "
    "arm again",
  )
  p.add_argument(
    "--peak-memory-only",
    action="store_true",
    help="only part 3, the compiled peak memory of one update (no training; minutes): with "
    "--uncompressed-control also GRPO(N=8) and SAO with the stage-1 memory",
  )
  p.add_argument(
    "--skip-peak-memory",
    action="store_true",
    help="skip part 3, the compiled peak memory (nine compiles: most of a --quick run's "
    "measuring); a later --resume run without this flag adds it to the file",
  )
  p.add_argument(
    "--params-dir",
    default="",
    help="save each arm's trained parameters here; a rerun with the same settings restores "
    "them instead of training (resumes a stopped run)",
  )
  p.add_argument(
    "--compile-cache",
    default="off",
    help="JAX's persistent compilation cache (sao_jax.startup: user, a directory, or off): "
    "runs of the same programs load them instead of compiling; training seconds then exclude "
    "what the cache saved (recorded in the JSON)",
  )
  p.add_argument("--out", default=str(ROOT / "results/bench_compression.json"))
  p.add_argument(
    "--resume",
    action="store_true",
    help="keep the parts --out already holds from a stopped run with the same settings "
    "(needs --params-dir, so that the arms are restored, not retrained): a task's short "
    "episodes, its bytes and filters, each arm's 1,000-step accuracy, its peak memory",
  )
  return p


def config_module(path: str):
  file = path.rsplit(":", 1)[0] if ":" in path and not pathlib.Path(path).exists() else path
  spec = importlib.util.spec_from_file_location("lh_config", file)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def snapshot_long_spec(args, parser):
  """For the scripts over bench_compression's snapshots (`memory_lab.add_snapshot_args`): the
  config path (its `default` unless one is named), the config module, and --task's long
  episodes with --long-steps applied; a task without long episodes is a usage error."""
  cfg_path = args.config if ":" in args.config else f"{args.config}:default"
  mod = config_module(cfg_path)
  if args.task not in mod.LONG_TASKS:
    parser.error(f"--task {args.task!r}: no long episodes (have {sorted(mod.LONG_TASKS)})")
  spec = mod.LONG_TASKS[args.task]
  if args.long_steps:
    spec = dataclasses.replace(spec, n_steps=args.long_steps)
  return cfg_path, mod, spec


# 1. bytes per stage -----------------------------------------------------------------------
def bytes_per_stage(cfg: Config, progs, policy, params, tasks, *, detail: bool = True) -> dict:
  """Runs the expert episodes through the sampler's compress program, all side by side.
  `detail`: also the LSTM's surprise (and the learned salience) per kind of step."""
  c = cfg.compression
  n = len(tasks)
  scripts = [script(t, L.TOK) for t in tasks]
  n_steps = len(scripts[0][0])
  streams = progs.empty_streams(n)
  records = []  # each step's evicted entries, left on the device until the end
  t0 = time.time()
  for s in range(n_steps):
    segs = [segment(obs[s], acts[s], c.step_len) for obs, acts, _ in scripts]
    seg, segv = right_pad(segs, c.step_len, L.TOK.pad_id)
    reward = np.asarray([1.0 if s in g else 0.0 for _, _, g in scripts], np.float32)
    bnd = np.asarray([t.prompt.split(SEP)[s] in BOUNDARIES for t in tasks])
    last = np.full(n, s == n_steps - 1)
    streams = progs.compress(params, streams, seg, segv, reward, bnd, last, np.ones(n, bool))
    records.append(gone_record(streams))
  bank = jax.device_get(streams.bank)
  secs = time.time() - t0
  graves = [{} for _ in range(n)]
  for record in jax.device_get(records):
    bury(graves, record)
  evicted = np.asarray(jax.device_get(streams.evicted))
  if [len(g) for g in graves] != evicted.tolist():
    raise RuntimeError(f"graveyard sizes {[len(g) for g in graves]} != evictions {evicted}")
  gone = [graveyard_arrays(g, bank.vec_ced[i, 0]) for i, g in enumerate(graves)]
  grave_bytes = np.asarray([graveyard_nbytes(x["gone_vec_ged"]) for x in gone], np.float64)
  width = cfg.model.width
  m, d = c.vectors_per_step, c.dim
  tokens = np.asarray([episode_tokens(t, L.TOK) for t in tasks], np.float64)
  kept = bank.count.astype(np.float64)
  fact_kept, fact_visible = [], []
  for i, t in enumerate(tasks):
    steps = bank.step_c[i, : bank.count[i]]
    log = memory_log(steps, gone[i], n_steps)
    for q, f in question_facts(t):
      fact_kept.append(f in steps)
      fact_visible.append(f in seen_at(log, q, c.visible))
  per_stage = {
    "full_context_fp32_embeddings": tokens * width * 4,
    "stage1_semantic_fp32": np.full(n, n_steps * m * d * 4.0),
    "stage2_temporal_fp32": kept * m * d * 4,
    "stage3_int8": kept * (m * d + m * 4 + 2),
    "stage3_graveyard_exact_replay": grave_bytes,
    "stage3_int8_with_graveyard": kept * (m * d + m * 4 + 2) + grave_bytes,
  }
  out = {k: float(v.mean()) for k, v in per_stage.items()}
  full = out["full_context_fp32_embeddings"]
  return {
    "episodes": n,
    "steps": n_steps,
    "tokens_per_episode": float(tokens.mean()),
    "kept_steps_mean": float(kept.mean()),
    "kept_frac": float(kept.mean() / n_steps),
    "facts_kept_frac": float(np.mean(fact_kept)),
    "facts_visible_at_question_frac": float(np.mean(fact_visible)),
    "dropped_bank_full": int(np.sum(jax.device_get(streams.dropped_full))),
    "evicted": int(evicted.sum()),
    "graveyard_over_stage3": float(grave_bytes.mean() / out["stage3_int8"]),
    **(_by_kind(cfg, policy, params, tasks) if detail else {}),
    "bytes": out,
    # Not for the graveyard (not a stage) or 0 bytes.
    "reduction_vs_full": {
      k: full / v for k, v in out.items() if v > 0 and k != "stage3_graveyard_exact_replay"
    },
    "kv_cache_fp32_bytes": float(tokens.mean() * 2 * cfg.model.depth * width * 4),
    "compress_seconds": secs,  # the compress calls; the graveyard is fetched after
  }


def memory_log(kept_steps, gone: dict, n_steps: int) -> list[tuple[int, int]]:
  """Every entry a bank held, as (its step, the first step it was no longer seen at), sorted:
  the kept ones (`kept_steps`) to the end, the evicted ones (`gone`, a trajectory's graveyard
  arrays: `gone_step_g` evicted at `gone_at_g`) to the step after their eviction (memory.py)."""
  evicted = zip(gone["gone_step_g"], gone["gone_at_g"], strict=True)
  return sorted(
    [(int(k), n_steps + 1) for k in kept_steps] + [(int(k), int(at) + 1) for k, at in evicted]
  )


def seen_at(log: list[tuple[int, int]], q: int, visible: int) -> list[int]:
  """Steps of the entries the policy saw when it acted at step q: the last `visible` of
  those the bank held then."""
  return [k for k, until in log if k < q < until][-visible:]


def question_facts(task) -> list[tuple[int, int]]:
  """(question step, step of the fact it asks about) of each graded step, in step order:
  "Ann's pin?" <- "Ann's pin: 7", "door 2?" <- "key 2 ..."."""
  obs = task.prompt.split(SEP)
  out = []
  for q in sorted(graded_steps(task)):
    key = obs[q][:-1] + ":" if obs[q].endswith("pin?") else "key " + obs[q].split()[1][:-1]
    f = next(k for k, o in enumerate(obs) if o.startswith(key + " ") or o.startswith(key + ":"))
    out.append((q, f))
  return out


def error_attribution(cfg: Config, trajs, tasks, control_rewards: np.ndarray | None) -> dict:
  """Why the compressed arm missed the questions it missed, on its own greedy rollouts
  (`trajs` of `tasks`, their graded steps in order; `control_rewards` the control's on the
  same questions, or None): was the fact among the entries the policy saw when asked (then
  the policy misread its memory) or not (the filter dropped or evicted it first)? For every
  miss, and for the `lost` ones (the control right); with each lost question's distance.
  Keeps, question by question, whether the fact was seen and its distance (`per_question`),
  so that a control measured in a later run (`--arms`) is paired without the rollouts."""
  seen, kept, gaps = [], [], []
  for traj, task in zip(trajs, tasks, strict=True):
    b = traj.bank
    log = memory_log(b["step_c"][: b["entries"]], b, len(traj.rewards))
    qf = question_facts(task)
    if len(qf) != int(traj.graded.sum()):
      raise RuntimeError(f"{task.task_id}: {len(qf)} questions, {traj.graded.sum()} graded")
    ever = {k for k, _ in log}
    for q, f in qf:
      seen.append(f in seen_at(log, q, cfg.compression.visible))
      kept.append(f in ever)
      gaps.append(q - f)
  per_question = {
    "fact_seen": [int(x) for x in seen],
    "fact_kept": [int(x) for x in kept],
    "gap": [int(g) for g in gaps],
  }
  return attribute_errors(per_question, _rewards(trajs), control_rewards)


def attribute_errors(
  per_question: dict, rewards: np.ndarray, control_rewards: np.ndarray | None
) -> dict:
  """`error_attribution`'s counts from its per-question record and the arms' rewards:
  of each set of questions, how many had their fact among the entries seen when asked
  (`fact_seen`) and, where recorded, how many had it enter the bank at all (`fact_kept`: kept
  but not seen = evicted, or out of the visible entries, before the question)."""
  seen = np.asarray(per_question["fact_seen"], dtype=bool)
  kept = per_question.get("fact_kept")  # records before it was kept lack it
  kept = None if kept is None else np.asarray(kept, dtype=bool)
  gaps = np.asarray(per_question["gap"])
  right = np.asarray(rewards) > 0.5

  def count(sel):
    c = {"n": int(sel.sum()), "fact_seen": int((sel & seen).sum())}
    if kept is not None:
      c["fact_kept"] = int((sel & kept).sum())
    return c

  out = {"questions": len(seen), "fact_seen_frac": float(seen.mean()), "missed": count(~right)}
  if control_rewards is not None:
    lost = ~right & (np.asarray(control_rewards) > 0.5)
    out["lost"] = dict(count(lost), gaps=sorted(int(g) for g in gaps[lost]))
  out["per_question"] = per_question
  return out


# Recall distance buckets (question step - fact step) of the 1,000-step accuracy.
GAP_EDGES = (32, 64, 128, 256, 512, 1000)


def long_accuracy(arms: dict, tasks, *, length: int, done: dict | None = None, on_arm=None) -> dict:
  """Greedy accuracy on 1,000-step episodes, overall and by recall distance.

  arms: name -> (config, programs, policy or model, params, memory: bool). The full-context control
  trained on the short episodes reads the last `length` tokens (its trained context; the
  whole 1,000-step episode is ~10^4 tokens, past its position table and this machine's
  memory for training): what a control trained at this budget can do at this length.
  Each arm records its per-question rewards (`correct`, in question order), so `done` (this
  dict from a stopped run on the same episodes) keeps its finished arms, and the paired
  comparison still covers them; `on_arm(out)` is called after each arm (to save it). The
  compressed arm also records its banks (entries, evictions) and, question by question,
  whether the fact entered its bank and was seen when asked (`errors`, `error_attribution`;
  a kept arm measured before this was recorded lacks it: drop the arm from the file and run
  `--resume --arms compressed` to measure it again with the same parameters)."""
  gaps = np.asarray([q - f for t in tasks for q, f in question_facts(t)])
  out = {"episodes": len(tasks), "questions": len(gaps), "control_context_tokens": length}
  done = done or {}
  if (done.get("episodes"), done.get("questions")) == (out["episodes"], out["questions"]):
    # Every arm it finished, also those not run here (--arms: one arm a run).
    out.update({k: done[k] for k in LONG_ARM_NAMES if "correct" in done.get(k, {})})

  def pair():  # what stages 2+3 lose against the stage-1 memory, question by question
    if "uncompressed_memory" in out and "compressed" in out:
      control = np.asarray(out["uncompressed_memory"]["correct"])
      out["vs_uncompressed"] = _paired(control, np.asarray(out["compressed"]["correct"]))
      errors = out["compressed"].get("errors")
      if errors:  # the lost questions too, now that the control is here
        out["compressed"]["errors"] = attribute_errors(
          errors["per_question"], out["compressed"]["correct"], control
        )

  pair()  # also when every arm was kept
  for name, (cfg, progs, pol, params, memory) in arms.items():
    if name in out:
      continue
    t0 = time.time()
    _, trajs = L.evaluate(cfg, progs, pol, params, tasks, memory, length=length)
    r = _rewards(trajs)
    by_gap = {}
    for lo, hi in zip(GAP_EDGES[:-1], GAP_EDGES[1:], strict=True):
      sel = (gaps >= lo) & (gaps < hi)
      if sel.any():
        by_gap[f"{lo}-{hi}"] = {"questions": int(sel.sum()), "accuracy": float(r[sel].mean())}
    out[name] = dict(
      _accuracy_stats(trajs), by_gap=by_gap, seconds=time.time() - t0, correct=r.tolist()
    )
    if name == "compressed":
      # Its banks at these lengths, and why it missed what it missed (as on short episodes).
      out[name].update(
        kept_steps_mean=float(np.mean([t.bank["entries"] for t in trajs])),
        evicted_mean=float(np.mean([t.bank["evicted"] for t in trajs])),
        episodes_with_evictions=int(sum(t.bank["evicted"] > 0 for t in trajs)),
        errors=error_attribution(cfg, trajs, tasks, None),
      )
    pair()
    if on_arm:
      on_arm(out)
  return out


def _variant(cfg: Config, **comp) -> Config:
  """cfg with compression fields replaced (the model's memory slots follow `visible`)."""
  c = dataclasses.replace(cfg.compression, **comp)
  model = dataclasses.replace(cfg.model, memory_slots=c.visible * c.vectors_per_step)
  return dataclasses.replace(cfg, compression=c, model=model)


def uncompressed_cfg(cfg: Config, n_steps: int) -> Config:
  """The memory policy's configuration with stage 1 only: every step of an `n_steps` episode
  kept (keep threshold 0, budget = capacity = visible = n_steps, no eviction, no learned
  salience, so no salient turning points) in float32 (no INT8). The trained parameters do not
  depend on n_steps, so one trained policy runs at any episode length with the matching
  `n_steps`."""
  return _variant(
    cfg,
    keep_threshold=0.0,
    budget=n_steps,
    capacity=n_steps,
    visible=n_steps,
    evict=False,
    quantize=False,
    salience="none",
    salient_turning=False,
  )


def _paired(control: np.ndarray, other: np.ndarray) -> dict:
  """Relative loss (control - other) / control over the same questions, the s.e. of the
  paired per-question difference over the control's accuracy, and the discordant counts."""
  acc = float(control.mean())
  diff = control - other
  se = float(diff.std(ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else float("nan")
  return {
    "relative_loss": (acc - float(other.mean())) / max(acc, 1e-9),
    "relative_loss_stderr_paired": se / max(acc, 1e-9),
    "control_right_other_wrong": int(np.sum(diff > 0)),
    "other_right_control_wrong": int(np.sum(diff < 0)),
  }


# Keep-probability thresholds the learned filter is also measured at (besides the measured
# configuration's `compression.salience_threshold`): facts kept and bytes, same parameters.
SALIENCE_THRESHOLDS = (0.5, 0.25, 0.1, 0.0)


def filter_ablations(cfg: Config, params, tasks, *, window: int = 16) -> dict:
  """Facts kept / visible at their question on the 1,000-step episodes, same trained
  parameters, for each filter (learned salience, surprise only, surprise first-come) and
  what the policy reads (the whole bank, or the last `window` entries); the learned filter
  also at the keep-probability thresholds of `SALIENCE_THRESHOLDS` (a diagnostic of the
  trained head: the policy was trained on banks of the configured threshold)."""
  c = cfg.compression
  variants = {}
  if c.salience == "learned":
    variants["learned_salience_full_bank"] = {"visible": c.capacity}
    variants[f"learned_salience_last_{window}"] = {"visible": window}
    for t in SALIENCE_THRESHOLDS:
      if t != c.salience_threshold:
        variants[f"learned_salience_at_{t:g}_full_bank"] = {
          "visible": c.capacity,
          "salience_threshold": t,
        }
  variants["surprise_full_bank"] = {"salience": "none", "visible": c.capacity}
  variants[f"surprise_last_{window}"] = {"salience": "none", "visible": window}
  variants[f"surprise_first_come_last_{window}"] = {
    "salience": "none",
    "visible": window,
    "evict": False,
  }
  return {name: filter_row(cfg, params, tasks, **over) for name, over in variants.items()}


def filter_row(cfg: Config, params, tasks, **over) -> dict:
  """The bank of `cfg` with compression fields `over` replaced (same trained parameters) on
  `tasks`: `over` itself, entries, facts kept / visible at their question, evictions, steps
  dropped with the bank full, and the INT8 + graveyard reduction."""
  vcfg = _variant(cfg, **over)
  progs, pol = L.build(vcfg, True)
  # Without a salience head the policy's parameters have no "salience" part.
  vparams = {k: v for k, v in params.items() if k != "salience" or pol.comp.salience}
  r = bytes_per_stage(vcfg, progs, pol, vparams, tasks, detail=False)
  return dict(
    over,
    **{
      k: r[k]
      for k in (
        "kept_steps_mean",
        "facts_kept_frac",
        "facts_visible_at_question_frac",
        "evicted",
        "dropped_bank_full",
      )
    },
    int8_with_graveyard_reduction=r["reduction_vs_full"]["stage3_int8_with_graveyard"],
  )


def attention_cost(cfg: Config, train, test, *, length: int, window: int = 16) -> dict:
  """Measured cost of reading the whole bank against the last `window` entries: seconds per
  supervised update (batch of cfg.sft.batch_size episodes) and per sampling step (32
  episodes side by side: sample + compress), compile excluded, same machine, one after the
  other."""
  out = {}
  for visible in (window, cfg.compression.capacity):
    vcfg = _variant(cfg, visible=visible)
    progs, pol = L.build(vcfg, True, mode="sft")
    L.train(vcfg, progs, True, train, steps=1, length=length)  # compiles
    _, t1, _ = L.train(vcfg, progs, True, train, steps=1, length=length)
    _, t6, _ = L.train(vcfg, progs, True, train, steps=6, length=length)
    state = progs.init(jax.random.key(0))
    L.evaluate(vcfg, progs, pol, state.params, test[:32], True, length=length)  # compiles
    t0 = time.time()
    _, trajs = L.evaluate(vcfg, progs, pol, state.params, test[:32], True, length=length)
    steps = max(len(t.rewards) for t in trajs)
    out[f"visible_{visible}"] = {
      "memory_slots": visible * cfg.compression.vectors_per_step,
      "update_seconds": (t6 - t1) / 5,
      "sample_step_seconds": (time.time() - t0) / steps,
    }
  a, b = out[f"visible_{window}"], out[f"visible_{cfg.compression.capacity}"]
  out["full_bank_over_window"] = {
    "update": b["update_seconds"] / a["update_seconds"],
    "sample_step": b["sample_step_seconds"] / a["sample_step_seconds"],
  }
  return out


def _by_kind(cfg: Config, policy, params, tasks) -> dict:
  """The LSTM's relative surprise per kind of step (fact/key, question/door, boundary,
  common filler, less common filler): min / median / max over the episodes; and the learned
  salience (keep probability) likewise when the filter has one. Shows how far apart the
  steps worth keeping and the chit-chat are by each score."""
  c = cfg.compression
  scan = jax.jit(policy.comp.scan_trajectory)
  kinds: dict[str, list] = {}
  sal_kinds: dict[str, list] = {}
  for t in tasks:
    obs, acts, graded = script(t, L.TOK)
    seg, segv = right_pad(
      [segment(o, a, c.step_len) for o, a in zip(obs, acts, strict=True)], c.step_len, L.TOK.pad_id
    )
    text = t.prompt.split(SEP)
    v = policy.comp.encode(params, jnp.asarray(seg), jnp.asarray(segv))
    rew = jnp.asarray([1.0 if s in graded else 0.0 for s in range(len(obs))])
    bnd = jnp.asarray([o in BOUNDARIES for o in text])
    _, info = scan(params, v, rew, bnd, jnp.ones(len(obs), bool))
    sur = np.asarray(info["surprise"])
    sal = np.asarray(info["salience"])
    for k, o in enumerate(text[1:], start=1):  # step 0 has no prediction
      kind = (
        "fact"
        if (":" in o or "code" in o)
        else "question"
        if o.endswith("?")
        else "boundary"
        if o in BOUNDARIES
        else "filler"
        if o in ("Go on.", "hall.")
        else "filler_variant"
      )
      kinds.setdefault(kind, []).append(float(sur[k]))
      sal_kinds.setdefault(kind, []).append(float(sal[k]))

  def table(by):
    return {
      k: {"n": len(x), "min": min(x), "median": float(np.median(x)), "max": max(x)}
      for k, x in by.items()
    }

  out = {"surprise_by_kind": table(kinds)}
  if c.salience == "learned":
    out["salience_by_kind"] = table(sal_kinds)
  return out


def _rewards(trajs) -> np.ndarray:
  return np.concatenate([t.rewards[t.graded] for t in trajs]).astype(np.float64)


def _accuracy_stats(trajs) -> dict:
  """Accuracy over graded questions with its binomial standard error and a 95 % Wilson
  interval (the s.e. is 0 at 0 or 1; the interval is not)."""
  r = _rewards(trajs)
  n, p = len(r), float(r.mean())
  return {
    "accuracy": p,
    "questions": n,
    "stderr": float(np.sqrt(p * (1 - p) / n)),
    "wilson95": list(wilson(p, n, z=1.96)),
  }


# 3. peak memory ---------------------------------------------------------------------------
def _abstract(tree):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), tree)


def _memory(compiled) -> dict:
  ma = compiled.memory_analysis()
  total = (
    ma.argument_size_in_bytes
    + ma.output_size_in_bytes
    + ma.temp_size_in_bytes
    - ma.alias_size_in_bytes
  )
  return {
    "argument": ma.argument_size_in_bytes,
    "output": ma.output_size_in_bytes,
    "temp": ma.temp_size_in_bytes,
    "alias": ma.alias_size_in_bytes,
    "peak": total,
  }


def peak_memory(
  cfg: Config, tasks, *, group: int = 8, window: int | None = None, stage1: bool = False
) -> dict:
  """Compiled memory of one learner update on `tasks` (one trajectory each for SAO).

  window: the full-context control's trained context (tokens). Where the episodes are longer,
  GRPO(N=8) with full attention over that window is measured too: the control that trains
  at this length. stage1: also the memory policy with stage 1 only (every step kept in
  float32, `uncompressed_cfg`, the control that trains at 1,000 steps), as a GRPO(N=8)-shaped
  update (8 trajectories per task; group-relative advantages are computed before the update
  and cost it nothing) and as SAO (one)."""
  c = cfg.compression
  n_steps = len(tasks[0].prompt.split(SEP))
  graded = len(tasks[0].answer.split(","))
  ctx = L.full_len(tasks)
  tx = make_optimizer(cfg.sft.optim)
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]).reshape(1, 1, 1), cfg.mesh.axes)

  def full_context_update(n, tokens):
    # GRPO(N=n): every graded step of each of the n trajectories is a row whose prompt is the
    # context up to that step (its last `tokens` tokens, left-padded to the longest).
    model_cfg = dataclasses.replace(
      L.model_cfg(cfg, False, tokens + L.MAX_NEW), max_len=tokens + L.MAX_NEW
    )
    grpo_cfg = dataclasses.replace(
      cfg, model=model_cfg, compression=dataclasses.replace(c, enabled=False)
    )
    model = TransformerLM(model_cfg)
    rl = RLConfig(group_size=n, prompts_per_step=len(tasks) * graded)
    gp = compile_programs(
      grpo_cfg,
      model,
      tx,
      make_rl_update(model, tx, rl),
      with_ref=False,
      prompt_len=tokens,
      max_new_tokens=L.MAX_NEW,
      temperature=1.0,
      eos_id=L.TOK.eos_id,
      pad_id=L.TOK.pad_id,
      mesh=mesh,
    )
    rows = len(tasks) * graded * n
    gbatch = RLBatch.abstract(rows, tokens, L.MAX_NEW)
    return _memory(gp.update.lower(jax.eval_shape(gp.init, jax.random.key(0)), gbatch).compile())

  grpo = full_context_update(group, ctx)
  # Decomposition: one trajectory per task with full context (the group factor alone).
  single_full = full_context_update(1, ctx)

  def memory_update(mcfg, n):
    # n trajectories per task; rows = each one's graded steps; per-step segments for the
    # encoder and LSTM; the shipped bank (INT8 unless the config turns stage 3 off).
    mc = mcfg.compression
    mprogs, _ = L.build(mcfg, True, mode="rl")
    sbatch = MemoryBatch.abstract(
      len(tasks) * n,
      n_steps,
      graded,
      mc.window,
      L.MAX_NEW,
      step_len=mc.step_len,
      capacity=mc.capacity,
      vectors=mc.vectors_per_step,
      dim=mc.dim,
      sampled=True,
    )
    sstate = jax.eval_shape(mprogs.init, jax.random.key(0))
    return _memory(mprogs.update.lower(sstate, sbatch).compile())

  sao = memory_update(cfg, 1)
  out = {
    "tasks": len(tasks),
    "steps": n_steps,
    "graded_rows_per_trajectory": graded,
    "full_context_tokens": ctx,
    "grpo_n8_full_context": grpo,
    "sao_compressed": sao,
    "single_trajectory_full_context": single_full,
    "ratio_sao_over_grpo": sao["peak"] / grpo["peak"],
  }
  if window is not None and window < ctx:
    windowed = full_context_update(group, window)
    out.update(
      control_window_tokens=window,
      grpo_n8_window_control=windowed,
      ratio_sao_over_grpo_window=sao["peak"] / windowed["peak"],
    )
  if stage1:
    ucfg = uncompressed_cfg(cfg, n_steps)
    g1 = memory_update(ucfg, group)
    out.update(
      grpo_n8_stage1_memory=g1,
      sao_stage1_memory=memory_update(ucfg, 1),
      ratio_sao_over_grpo_stage1=sao["peak"] / g1["peak"],
    )
  return out


def peak_memories(cfg: Config, test, long_tasks, length: int, stage1: bool, log) -> dict:
  """`peak_memory` on the accuracy episodes and on the 1,000-step ones (with the control's
  trained window, and with `stage1` the stage-1 memory), logged."""
  memory = {
    "accuracy_episodes": peak_memory(cfg, test[:1]),
    "long_episodes": peak_memory(cfg, long_tasks[:1], window=length, stage1=stage1),
  }
  for k, v in memory.items():
    log(
      f"  peak memory ({k}): GRPO(N=8) {v['grpo_n8_full_context']['peak'] / 1e6:.1f} MB, "
      f"SAO {v['sao_compressed']['peak'] / 1e6:.1f} MB, ratio {v['ratio_sao_over_grpo']:.4f}"
    )
    if "grpo_n8_stage1_memory" in v:
      log(
        f"  ... GRPO(N=8) with stage-1 memory (every step, float32) "
        f"{v['grpo_n8_stage1_memory']['peak'] / 1e6:.1f} MB, ratio SAO / that "
        f"{v['ratio_sao_over_grpo_stage1']:.4f}"
      )
    if "grpo_n8_window_control" in v:
      log(
        f"  ... GRPO(N=8) on the control's last {v['control_window_tokens']} tokens "
        f"{v['grpo_n8_window_control']['peak'] / 1e6:.1f} MB, ratio SAO / that "
        f"{v['ratio_sao_over_grpo_window']:.3f}"
      )
  return memory


def short_episodes(
  arms: dict,
  trained: dict,
  spec,
  train_spec,
  test,
  length,
  control_steps,
  log,
  done=None,
  prov=None,
  eval_overrides=(),
):
  """Part 2 on the held-out short episodes: each arm's greedy accuracy with its training
  record (`trained`: name -> (seconds, last metrics, origin)), the compressed arm with float
  memory (stage 3 off), its misses attributed, and its paired loss against each control.

  Each arm records its per-question rewards (`correct`, in question order), so `done` (this
  dict from an earlier run with the same settings) keeps the arms it measured: those not run
  here (`--arms`: one arm per run, merged into one file), and those run here whose training
  record is the restored snapshot's (the compressed arm's also measured under the same
  `eval_overrides`, the --eval-set it records); the paired comparisons are made from the kept
  answers."""
  done = done or {}
  kept_arms = done.get("arms", {})
  n_questions = sum(len(question_facts(t)) for t in test)
  stats, rewards = {}, {}
  for name, a in kept_arms.items():
    if name == "compressed_float_memory":
      continue
    answers = len(a.get("correct") or ()) == n_questions
    if name not in arms:  # not run here: kept as measured (paired only if it has answers)
      stats[name] = a
    elif answers and a.get("train_seconds") == trained[name][0]:
      if name != "compressed" or a.get("eval_overrides", []) == list(eval_overrides):
        stats[name] = a
    if name in stats and answers:
      rewards[name] = np.asarray(a["correct"], dtype=np.float64)
  other = [n for n in arms if n in kept_arms and n not in stats]
  if other:
    log(
      f"  the kept file holds other parameters (or another --eval-set) for {', '.join(other)}: "
      "measuring again"
    )
  mem_trajs = None
  for name, (acfg, progs, pol, params, memory) in arms.items():
    if name in stats:
      continue
    secs, metrics, origin = trained[name]
    acc, trajs = L.evaluate(acfg, progs, pol, params, test, memory, length=length)
    a = stats[name] = dict(_accuracy_stats(trajs), train_seconds=secs, final_metrics=metrics)
    rewards[name] = _rewards(trajs)
    a["correct"] = rewards[name].tolist()
    a["measured_at"] = _measured_at(prov or {})
    if memory:
      a["kept_steps_mean"] = float(np.mean([t.bank["entries"] for t in trajs]))
    if name == "compressed":
      a["eval_overrides"] = list(eval_overrides)
      # Episodes whose learner replay needs the graveyard (memory.py).
      a["episodes_with_evictions"] = int(sum(t.bank["evicted"] > 0 for t in trajs))
      mem_trajs = trajs
      log(f"  compressed: accuracy {acc:.3f} +- {a['stderr']:.3f} ({secs:.0f} s training)")
    elif name == "full_context":
      log(f"  full context: accuracy {acc:.3f} +- {a['stderr']:.3f} ({secs:.0f} s training)")
    else:
      a.update(bank_capacity=acfg.compression.capacity, steps=control_steps)
      log(
        f"  uncompressed memory (stage 1 only): accuracy {acc:.3f} ({control_steps} steps, "
        f"{secs:.0f} s training)"
      )
    if origin:
      a["params"] = origin
  task = {
    "spec": dataclasses.asdict(spec),
    "train_spec": dataclasses.asdict(train_spec),
    "chance": 0.1,  # a uniform guess of the answer digit
  }
  if mem_trajs is not None:
    # Stage 3 ablation: the same trained parameters with float memory.
    cfg, _, _, mem_params, _ = arms["compressed"]
    fcfg = dataclasses.replace(
      cfg, compression=dataclasses.replace(cfg.compression, quantize=False)
    )
    fprogs, fpol = L.build(fcfg, True)
    acc_f, ftrajs = L.evaluate(fcfg, fprogs, fpol, mem_params, test, True, length=length)
    stats["compressed_float_memory"] = _accuracy_stats(ftrajs)
    log(f"  float memory: {acc_f:.3f}")
    errors = error_attribution(cfg, mem_trajs, test, rewards.get("full_context"))
    log(
      f"  compressed missed {errors['missed']['n']} (fact seen when asked: "
      f"{errors['missed']['fact_seen']})"
      + (
        f"; lost vs the control {errors['lost']['n']} (fact seen: {errors['lost']['fact_seen']})"
        if "lost" in errors
        else ""
      )
    )
    task["compressed_errors"] = errors
  elif "compressed" in stats:  # kept: so are the parts measured with its parameters
    if "compressed_float_memory" in kept_arms:
      stats["compressed_float_memory"] = kept_arms["compressed_float_memory"]
    errors = done.get("compressed_errors")
    if errors and "per_question" in errors and "compressed" in rewards:
      # Attributed again from the kept record: a control measured here is paired too.
      errors = attribute_errors(
        errors["per_question"], rewards["compressed"], rewards.get("full_context")
      )
    if errors:
      task["compressed_errors"] = errors
  task["arms"] = stats
  if "full_context" in rewards and "compressed" in rewards:
    # Paired over the same held-out questions: s.e. of the mean per-question difference.
    vs_full = _paired(rewards["full_context"], rewards["compressed"])
    log(
      f"  relative loss vs full context {100 * vs_full['relative_loss']:.1f}% "
      f"+- {100 * vs_full['relative_loss_stderr_paired']:.1f}%"
    )
    task.update(
      relative_loss=vs_full["relative_loss"],
      relative_loss_stderr_paired=vs_full["relative_loss_stderr_paired"],
      questions_discordant={
        "full_right_compressed_wrong": vs_full["control_right_other_wrong"],
        "compressed_right_full_wrong": vs_full["other_right_control_wrong"],
      },
    )
  if "uncompressed_memory" in rewards and "compressed" in rewards:
    # Against the stage-1-only memory: what the temporal filter and INT8 lose.
    task["vs_uncompressed"] = _paired(rewards["uncompressed_memory"], rewards["compressed"])
    log(
      "  relative loss of compressed vs the stage-1 memory "
      f"{100 * task['vs_uncompressed']['relative_loss']:.1f}%"
    )
  return task


def _measured_at(prov: dict) -> dict:
  """When, at which commit and on which CPU an arm was measured (arms of one file may come
  from runs on different machines: `--arms`); `prov` is the run's provenance, read once at
  its start."""
  return {
    "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    "commit": prov.get("commit"),
    "cpu": (prov.get("machine") or {}).get("cpu"),
  }


def series(tasks, overrides, steps: int, control_steps: int, quick: bool) -> str:
  """The series a run belongs to: its tasks, training budget and --set overrides (the seeds of
  one series differ in nothing else; --eval-set and --arms add to a file, not a series)."""
  parts = ["bench_compression", "+".join(tasks), f"steps{steps}"]
  parts += [f"control{control_steps}"] if control_steps != steps else []
  parts += [",".join(overrides)] if overrides else []
  return "/".join(parts + (["quick"] if quick else []))


def eval_config(cfg_path: str, overrides, eval_overrides, parser) -> Config:
  """The compressed arm's evaluation config: `overrides` (--set) then `eval_overrides`
  (--eval-set), which may only set compression fields (what the sampler's filter and bank do;
  the training is --set's)."""
  bad = [o for o in eval_overrides if not o.split("=", 1)[0].strip().startswith("compression.")]
  if bad:
    parser.error(
      f"--eval-set {bad[0]!r}: only compression.* fields are evaluation settings (the arm is "
      "trained as --set says)"
    )
  try:
    return load_config(cfg_path, overrides=[*overrides, *eval_overrides])
  except ConfigError as e:
    parser.error(f"--eval-set: {e}")


def same_shapes(progs, eval_progs, eval_overrides, parser) -> None:
  """Refuses an --eval-set under which the trained parameters would not fit the policy."""

  def shapes(p):
    return jax.tree.map(lambda x: (x.shape, x.dtype), jax.eval_shape(p.init, jax.random.key(0)))

  try:
    same = shapes(progs).params == shapes(eval_progs).params
  except (TypeError, ValueError):  # other tree structure
    same = False
  if not same:
    parser.error(
      f"--eval-set {' '.join(eval_overrides)} changes the policy's parameters (their shapes): "
      "it is a training setting, pass it with --set"
    )


def portable_path(cfg_path: str) -> str:
  """A config path relative to the checkout when it lies inside it."""
  try:
    return str(pathlib.Path(cfg_path).resolve().relative_to(ROOT))
  except ValueError:
    return cfg_path


def _settings(key) -> dict:
  """What must match for a snapshot to be reused or continued: the key less the config file's
  path (a frozen copy of the checkout elsewhere holds the same file; the resolved
  configuration is compared instead) and the step count (a snapshot at fewer steps is
  continued, not refused)."""
  return {k: v for k, v in (key or {}).items() if k not in ("config", "steps")}


def train_arm(
  params_dir: str,
  key: dict,
  cfg: Config,
  progs,
  memory: bool,
  train,
  every: int = 100,
  prov: dict | None = None,
  **kw,
):
  """`L.train` for one arm (`kw`: steps, length, seed, log), returning (params, seconds, last
  metrics, origin). With `params_dir` the trained state is saved under params_dir/<task>/<arm>
  as an Orbax snapshot at its step count, whose metadata holds `key` (everything that
  determines the training). A rerun with the same settings restores the snapshot at `steps`
  (checksums verified) with the seconds and metrics of the run that trained it; when the
  folder only has one at fewer steps (k), that state (optimizer and RNG included) is restored
  and trained on to `steps` with the batches a single run would have had, and saved beside
  it. Snapshots are also saved every `every` steps, so a run stopped in its training trains
  on from the last of them. `origin` says where the parameters came from and on which CPU. A
  snapshot saved with other settings or under another resolved configuration is an error,
  not a silent reuse."""
  if not params_dir:
    state, secs, metrics = L.train(cfg, progs, memory, train, **kw)
    return state.params, secs, metrics, None
  where = pathlib.Path(params_dir) / key["task"] / key["arm"]
  steps = kw.get("steps")
  mngr = ckpt.manager(where, every=1, keep=1_000_000, keep_best=False)
  metas = {s: ckpt.read_meta(where, s, mngr)[1] for s in mngr.all_steps()}
  resolved = None
  for meta in metas.values():
    if _settings(meta.get("bench_key")) != _settings(key):
      mngr.close()
      raise SystemExit(
        f"{where} holds parameters trained with {meta.get('bench_key')}, not {key}: "
        "pass another --params-dir"
      )
    # The resolved configuration too (a config file edited since, under the same path);
    # resolved only once the settings match (`cfg` may be None in a settings mismatch).
    if resolved is None:
      resolved = json.loads(json.dumps(config_lib.to_dict(cfg)))
    saved = config_lib.upgrade(meta.get("config") or {})
    if saved != resolved:
      mngr.close()
      changed = sorted(k for k in resolved if resolved[k] != saved.get(k))
      raise SystemExit(
        f"{where} holds parameters trained under another configuration (differs in "
        f"{changed}): pass another --params-dir"
      )
  log = kw.get("log") or (lambda _: None)
  like = progs.init(jax.random.key(kw.get("seed", 0)))
  if steps in metas:
    mngr.close()
    params, step, meta = ckpt.restore_params(where, like.params, steps)
    log(f"  {key['arm']}: parameters restored from {where} step {step} (not retrained)")
    origin = {
      "restored_from": str(where),
      "step": step,
      "trained_on_cpu": meta.get("cpu"),
      "trained_at_commit": meta.get("commit"),
    }
    if meta.get("continued"):
      origin["continued"] = meta["continued"]
    return params, meta["train_seconds"], meta["final_metrics"], origin
  earlier = max((s for s in metas if s < steps), default=None)
  state, before, origin, parts = None, 0.0, None, []
  if earlier is not None:
    state, _ = ckpt.restore_state(mngr, like, earlier)
    prev = metas[earlier]
    before = prev["train_seconds"]
    parts = prev.get("continued") or [
      {"steps": earlier, "seconds": before, "cpu": prev.get("cpu"), "commit": prev.get("commit")}
    ]
    log(f"  {key['arm']}: continuing from {where} step {earlier} to step {steps}")
  prov = prov or provenance(devices=False)  # the run's, when it passes it in
  here = {"cpu": (prov.get("machine") or {}).get("cpu") or cpu(), "commit": prov.get("commit")}

  def snapshot(state, step: int, secs: float, metrics: dict) -> dict:
    meta = {
      "bench_key": dict(key, steps=step),
      "train_seconds": before + secs,
      "final_metrics": metrics,
      **here,
    }
    if earlier is not None:
      meta["continued"] = [*parts, {"steps": step, "seconds": secs, **here}]
    ckpt.save(mngr, state, cfg, meta, force=True)
    return meta

  try:
    state, secs, metrics = L.train(
      cfg, progs, memory, train, state=state, every=every, on_snapshot=snapshot, **kw
    )
    meta = snapshot(state, steps, secs, metrics)
    mngr.wait_until_finished()
  finally:
    mngr.close()
  if earlier is not None:
    origin = {"continued_from": str(where), "from_step": earlier, "continued": meta["continued"]}
  return state.params, before + secs, metrics, origin


def main(argv=None) -> dict:
  args = _parser().parse_args(argv)
  variant = "tiny" if args.quick and ":" not in args.config else "default"
  cfg_path = args.config if ":" in args.config else f"{args.config}:{variant}"
  try:
    cfg = load_config(cfg_path, overrides=args.set)
  except ConfigError as e:
    _parser().error(str(e))
  ecfg = eval_config(cfg_path, args.set, args.eval_set, _parser())
  cache = enable_compile_cache(args.compile_cache)
  mod = config_module(args.config)
  variant = cfg_path.rsplit(":", 1)[1]
  names = (
    args.tasks.split(",")
    if args.tasks
    else (["retention"] if args.quick else list(mod.TASKS[variant]))
  )
  known = {**mod.TASKS[variant], **getattr(mod, "EXTRA_TASKS", {}).get(variant, {})}
  specs = {k: known[k] for k in names}
  long_specs = dict(mod.LONG_TASKS)
  if args.quick:
    long_specs = {k: dataclasses.replace(v, n_steps=120, n_facts=3) for k, v in long_specs.items()}
  if args.peak_memory_only and args.skip_peak_memory:
    _parser().error("--peak-memory-only and --skip-peak-memory leave nothing to measure")
  if args.peak_memory_only and set(specs) - set(long_specs):
    _parser().error(
      f"--peak-memory-only measures 1,000-step episodes; no long episodes for "
      f"{sorted(set(specs) - set(long_specs))} (have {sorted(long_specs)})"
    )
  steps = args.steps or (cfg.sft.steps if not args.quick else 10)
  control_steps = args.control_steps or steps
  if args.control_steps and not args.uncompressed_control:
    _parser().error("--control-steps sets the stage-1 control's steps: add --uncompressed-control")
  long_eval = args.long_eval_episodes if not args.quick else min(args.long_eval_episodes, 2)
  num_test = args.num_test or (8 if args.quick else 256)
  log = print
  t_start = time.time()
  out = pathlib.Path(args.out)

  def save(done: str, complete: bool = False):
    """Writes what is measured so far (a long run stopped part-way keeps its finished parts):
    `complete` false until the end, `done` the last part finished."""
    result["seconds"] = time.time() - t_start
    if complete:
      rf.finish()
    else:
      rf.write(done=done)

  if args.resume and not args.params_dir:
    _parser().error("--resume keeps measurements of restored arms: add --params-dir")
  every_arm = ["compressed"]
  every_arm += [] if args.no_token_control else ["full_context"]
  every_arm += ["uncompressed_memory"] if args.uncompressed_control else []
  run_arms = args.arms.split(",") if args.arms else every_arm
  if not run_arms or set(run_arms) - set(every_arm):
    _parser().error(
      f"--arms {args.arms!r}: choose from {','.join(every_arm)} (the arms these flags ask for)"
    )
  # What a stopped run must share with its rerun for --resume to keep its measurements (the
  # resolved config too; --eval-set and --arms may differ: they add to the file).
  settings = {
    "config_file": config_file_id(portable_path(cfg_path)),
    "overrides": list(args.set),
    "quick": args.quick,
    "steps": steps,
    "control_steps": control_steps,
    "num_test": num_test,
    "seed": args.seed,
  }
  try:
    rf = ResultFile(
      out,
      series=series(names, args.set, steps, control_steps, args.quick),
      config=cfg,
      settings=settings,
      resume=args.resume,
    )
  except ResultFileError as e:
    _parser().error(f"--resume: {e}")
  result = rf.update(
    eval_overrides=list(args.eval_set),
    machine={"platform": platform.platform(), "devices": str(jax.devices())},
    arms_run=run_arms,
    compile_cache=cache,
    tasks={},
  ).doc
  if "resumed_from" in result:
    result["resumed_from"].update(
      {k: rf.kept.get(k) for k in ("seconds", "arms_run")},
      eval_overrides=rf.kept.get("eval_overrides", []),
    )
  kept_tasks = rf.kept.get("tasks") or {}
  # Parts measured with the compressed arm's evaluation config (peak memory) are kept only
  # when the stopped run evaluated under the same --eval-set.
  same_eval = (result.get("resumed_from") or {}).get("eval_overrides", []) == args.eval_set
  for name, spec in specs.items():
    log(f"== {name}: {spec}")
    train = make_split(mod.TRAIN_TASKS[variant][name], "train", 4000, 0, num_test=num_test)
    test = make_split(spec, "test", num_test, 0)
    length = L.full_len(train + test)
    if args.peak_memory_only:
      long_tasks = make_split(long_specs[name], "test", 1, 1)
      result["tasks"][name] = {
        "spec": dataclasses.asdict(spec),
        "long_spec": dataclasses.asdict(long_specs[name]),
        "peak_memory": peak_memories(cfg, test, long_tasks, length, args.uncompressed_control, log),
      }
      save(f"{name}: peak memory")
      continue
    mem_progs = L.build(cfg, True, mode="sft")
    eval_progs = mem_progs if ecfg == cfg else L.build(ecfg, True, mode="sft")
    if ecfg != cfg:
      same_shapes(mem_progs[0], eval_progs[0], args.eval_set, _parser())
    train_kw = dict(steps=steps, length=length, seed=args.seed, log=log)
    # What determines an arm's trained parameters (checked before --params-dir reuses them).
    key = dict(
      task=name,
      train_spec=dataclasses.asdict(mod.TRAIN_TASKS[variant][name]),
      config=portable_path(cfg_path),
      overrides=list(args.set),
      num_test=num_test,
      **{k: v for k, v in train_kw.items() if k != "log"},
    )
    # Each arm's parameters (trained, or restored with --params-dir): name -> (config,
    # programs, policy or model, params, memory) and its training record.
    arms, trained = {}, {}
    for memory in (True,) if args.no_token_control else (True, False):
      arm_name = "compressed" if memory else "full_context"
      if arm_name not in run_arms:
        continue
      progs, pol = mem_progs if memory else L.build(cfg, False, full_len=length)
      params, *record = train_arm(
        args.params_dir,
        dict(key, arm=arm_name),
        cfg,
        progs,
        memory,
        train,
        prov=result["provenance"],
        **train_kw,
      )
      if memory:  # trained under cfg, measured under --eval-set
        cfg_m, progs, pol = ecfg, *eval_progs
      else:
        cfg_m = cfg
      arms[arm_name], trained[arm_name] = (cfg_m, progs, pol, params, memory), record
    if "uncompressed_memory" in run_arms:
      ucfg = uncompressed_cfg(cfg, max(spec.n_steps, mod.TRAIN_TASKS[variant][name].n_steps))
      uprogs, upol = L.build(ucfg, True, mode="sft")
      unc_params, *record = train_arm(
        args.params_dir,
        dict(key, arm="uncompressed_memory", steps=control_steps),
        ucfg,
        uprogs,
        True,
        train,
        prov=result["provenance"],
        **dict(train_kw, steps=control_steps),
      )
      arms["uncompressed_memory"] = (ucfg, uprogs, upol, unc_params, True)
      trained["uncompressed_memory"] = record
    mem_params = arms["compressed"][3] if "compressed" in arms else None
    kept = kept_tasks.get(name, {})
    task = short_episodes(
      arms,
      trained,
      spec,
      mod.TRAIN_TASKS[variant][name],
      test,
      length,
      control_steps,
      log,
      done=kept,
      prov=result["provenance"],
      eval_overrides=args.eval_set,
    )
    # What was measured with the compressed arm's parameters (bytes, filters) or none (peak
    # memory) stays with the file when this run did not measure it again; what it holds of an
    # arm measured again here (trained anew, or other parameters) on the long episodes is stale.
    redone = {a for a in arms if task["arms"].get(a) is not kept.get("arms", {}).get(a)}
    task.update({k: kept[k] for k in ("long_spec", "peak_memory") if k in kept})
    if not same_eval:
      task.pop("peak_memory", None)
    if "bytes_per_stage" in kept:
      stages = dict(kept["bytes_per_stage"])
      if "long_accuracy" in stages:
        stale = {LONG_ARM_OF.get(a, a) for a in redone}
        stale |= {"vs_uncompressed"} if "uncompressed_memory" in stale else set()
        stages["long_accuracy"] = {
          k: v for k, v in stages["long_accuracy"].items() if k not in stale
        }
      if "compressed" in redone:  # its bytes and filters are measured again; other arms'
        stages = {k: v for k, v in stages.items() if k == "long_accuracy"}  # accuracy stays
      if stages:
        task["bytes_per_stage"] = stages
    result["tasks"][name] = task
    if kept and not redone:
      log(f"  short episodes: kept from {out} (measured before the rerun)")
    save(f"{name}: short episodes" + (f" of {', '.join(sorted(redone))}" if redone else ""))
    if args.accuracy_only or name not in long_specs:
      continue
    task = result["tasks"][name]
    long_tasks = make_split(long_specs[name], "test", args.long_episodes, 1)
    stages = task.get("bytes_per_stage") or {}
    if stages.get("episodes") == args.long_episodes and "filters" in stages:
      log(f"  {long_specs[name].n_steps}-step bytes and filters: kept from {out}")
    elif mem_params is None:
      log(
        f"  {long_specs[name].n_steps}-step bytes and filters need the compressed arm: not in "
        f"this run (--arms) nor kept in {out}"
      )
    else:
      kept_long = stages.get("long_accuracy")  # other arms' (a run with --arms), if any
      stages = bytes_per_stage(ecfg, eval_progs[0], eval_progs[1], mem_params, long_tasks)
      if kept_long:
        stages["long_accuracy"] = kept_long
      log(
        f"  {long_specs[name].n_steps}-step bytes: "
        + ", ".join(f"{k} {v / 1e3:.1f} kB" for k, v in stages["bytes"].items())
      )
      log(
        f"  facts kept {stages['facts_kept_frac']:.3f}, visible at their question "
        f"{stages['facts_visible_at_question_frac']:.3f}, evictions {stages['evicted']}, "
        f"dropped (bank full) {stages['dropped_bank_full']}"
      )
      # Ablations with the same trained parameters: each filter, whole bank vs a window.
      stages["filters"] = filter_ablations(ecfg, mem_params, long_tasks)
      for k, v in stages["filters"].items():
        log(
          f"  {k}: facts kept {v['facts_kept_frac']:.3f}, visible at their question "
          f"{v['facts_visible_at_question_frac']:.3f}"
        )
      task.update(long_spec=dataclasses.asdict(long_specs[name]), bytes_per_stage=stages)
      save(f"{name}: bytes per stage and filters")
    if long_eval:
      evals = make_split(long_specs[name], "test", long_eval, 2)
      long_arms = {
        LONG_ARM_OF.get(a, a): arms[a] for a in ("compressed", "full_context") if a in arms
      }
      if "uncompressed_memory" in arms:
        lcfg = uncompressed_cfg(cfg, long_specs[name].n_steps)
        lprogs, lpol = L.build(lcfg, True, mode="sft")
        long_arms["uncompressed_memory"] = (lcfg, lprogs, lpol, unc_params, True)
      n_long = long_specs[name].n_steps
      task["bytes_per_stage"] = stages  # holds the long accuracy even without bytes (--arms)

      def saved(la, name=name, n_long=n_long, long_arms=long_arms, stages=stages):
        stages["long_accuracy"] = la
        save(f"{name}: {n_long}-step accuracy of " + ", ".join(k for k in long_arms if k in la))

      stages["long_accuracy"] = la = long_accuracy(
        long_arms, evals, length=length, done=stages.get("long_accuracy"), on_arm=saved
      )
      save(f"{name}: {n_long}-step accuracy")
      log(
        f"  {n_long}-step accuracy ({la['questions']} questions): "
        + ", ".join(
          f"{LONG_ARM_NAMES[k].format(length=length)} {la[k]['accuracy']:.3f}"
          for k in LONG_ARM_NAMES
          if k in la
        )
      )
    if "peak_memory" not in task and not args.skip_peak_memory:
      task["peak_memory"] = peak_memories(
        ecfg, test, long_tasks, length, args.uncompressed_control, log
      )
    if not (args.no_attention_cost or args.quick) and "attention_cost" not in result:
      result["attention_cost"] = attention_cost(cfg, train, test, length=length)
      log(f"  whole bank vs last 16 entries: {result['attention_cost']['full_bank_over_window']}")
  missing = {
    n: [a for a in every_arm if a not in t.get("arms", {})]
    for n, t in result["tasks"].items()
    if not args.peak_memory_only
  }
  missing = {n: m for n, m in missing.items() if m}
  if missing:  # --arms: the other arms' runs complete the file
    save("all but " + "; ".join(f"{n}: {', '.join(m)}" for n, m in missing.items()))
  else:
    save("all", complete=True)
  _table(result)
  print(f"wrote {out} ({result['seconds']:.0f} s)")
  return result


def _table(r: dict):
  if r.get("eval_overrides"):
    print(f"\nthe compressed arm measured with {' '.join(r['eval_overrides'])} (trained without)")
  print("\n| task | stage | bytes / trajectory | reduction |")
  print("|---|---|---:|---:|")
  for name, t in r["tasks"].items():
    if "bytes" not in t.get("bytes_per_stage", {}):  # --arms without the compressed arm
      continue
    s = t["bytes_per_stage"]
    for k, v in s["bytes"].items():
      red = s["reduction_vs_full"].get(k)
      red = f"{red:.1f}x" if red else "-"
      print(f"| {name} ({s['steps']} steps) | {k} | {v:,.0f} | {red} |")
  print("\n| task | filter, what the policy reads | facts kept | facts visible at question |")
  print("|---|---|---:|---:|")
  for name, t in r["tasks"].items():
    s = t.get("bytes_per_stage")
    for k, v in (s or {}).get("filters", {}).items():
      print(
        f"| {name} ({s['steps']} steps) | {k} | {v['facts_kept_frac']:.3f} | "
        f"{v['facts_visible_at_question_frac']:.3f} |"
      )
  print("\n| task | arm | accuracy on the long episodes | by recall distance (steps) |")
  print("|---|---|---:|---|")
  for name, t in r["tasks"].items():
    la = (t.get("bytes_per_stage") or {}).get("long_accuracy")
    for arm in [k for k in LONG_ARM_NAMES if k in la] if la else ():
      a = la[arm]
      gaps = ", ".join(
        f"{g}: {v['accuracy']:.2f} ({v['questions']})" for g, v in a["by_gap"].items()
      )
      print(f"| {name} | {arm} | {a['accuracy']:.3f} +- {a['stderr']:.3f} | {gaps} |")
  print("\n| task | arm | questions | chance | accuracy +- s.e. [Wilson 95 %] |")
  print("|---|---|---:|---:|---:|")
  for name, t in r["tasks"].items():
    for arm, a in t.get("arms", {}).items():
      print(
        f"| {name} | {arm} | {a['questions']} | {t['chance']:.2f} | {a['accuracy']:.3f} +- "
        f"{a['stderr']:.3f} [{a['wilson95'][0]:.3f}, {a['wilson95'][1]:.3f}] |"
      )
  print("\n| task | compressed against | relative loss (paired s.e.) |")
  print("|---|---|---:|")
  for name, t in r["tasks"].items():
    if "relative_loss" in t:
      print(
        f"| {name} | full context | {100 * t['relative_loss']:.1f}% "
        f"(+- {100 * t['relative_loss_stderr_paired']:.1f}%) |"
      )
    if "vs_uncompressed" in t:
      v = t["vs_uncompressed"]
      print(
        f"| {name} | uncompressed memory | {100 * v['relative_loss']:.1f}% "
        f"(+- {100 * v['relative_loss_stderr_paired']:.1f}%) |"
      )
  print("\n| task | episodes | GRPO(N=8) full context | SAO compressed | SAO / GRPO |")
  print("|---|---|---:|---:|---:|")
  for name, t in r["tasks"].items():
    for k, v in t.get("peak_memory", {}).items():
      print(
        f"| {name} | {k} ({v['steps']} steps) | {v['grpo_n8_full_context']['peak'] / 1e6:,.1f}"
        f" MB | {v['sao_compressed']['peak'] / 1e6:,.1f} MB | {v['ratio_sao_over_grpo']:.4f} |"
      )


if __name__ == "__main__":
  main()
