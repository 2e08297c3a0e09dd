"""Hyperparameter sweeps: `sao-jax sweep SWEEP.py[:variant] --dir DIR`.

A sweep file defines ``get_sweep(variant: str = "default") -> Sweep``: the base experiment
config, fixed overrides, the axes, seeds per point, the metric (a dotted path into each
trial's summary.json) and its direction, the search strategy and the budget. Optuna does the
searching (samplers, pruners) and the bookkeeping (a journal file in DIR), so that a sweep
survives `kill -9` and rerunning the same command resumes it.

Vocabulary: a *point* is one assignment of the axes; a *trial* is one point run with one
seed, i.e. one `sao-jax train --workdir DIR/trials/<trial number>` process, and one Optuna
trial. Every point runs with seeds 0..seeds-1 (`--set seed=s`; first_seed.. when set) and
is reported as the mean, standard error and 95 % t-interval of the metric over its seeds
(sao_jax.stats).

Resume. A trial that was running when the sweep died is still RUNNING in the journal; the
next run starts it again on the same workdir, where `sao-jax train` resumes from its own
snapshots (or, had it finished, returns its summary at once). Finished trials are never
started again; a point missing some of its seeds (a crash between creating them) gets them.

DIR holds: optuna.journal (the study), sweep.json (the resolved sweep; a different sweep in
the same DIR is an error), events.jsonl (one line per trial start and end), trials/<n>/
(workdirs with train.log), and the reports: trials.csv, trials.json, points.csv, sweep.png,
best_config.py (sao_jax.sweep_report).
"""

from __future__ import annotations

import dataclasses
import fcntl
import importlib.util
import itertools
import json
import math
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

from sao_jax import config as config_lib
from sao_jax.config import ConfigError
from sao_jax.setup import load_config, validate

STRATEGIES = ("grid", "oat", "random", "tpe")
TABLE_COLUMNS = (
  "trial",
  "point",
  "seed",
  "status",
  "attempts",
  "trial_wall_s",
  "reason",
  "workdir",
)
PRUNERS = ("median", "halving")
SFT_FREE = ("rl.", "sao.", "samplers.", "transport.")  # what shared_sft's axes may set
_CHOICE_TYPES = (type(None), bool, int, float, str)


def _check(ok: bool, msg: str):
  if not ok:
    raise ConfigError(msg)


def _finite(x) -> bool:
  return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# ---------------------------------------------------------------------------------------------
# The sweep file's vocabulary: axes, pruning, the sweep itself.


@dataclasses.dataclass(frozen=True)
class Choice:
  """A finite set of values: the grid points under strategy 'grid', a categorical
  distribution under 'random' and 'tpe'. Values: numbers, strings, booleans or None."""

  key: str
  values: tuple

  def __post_init__(self):
    object.__setattr__(self, "values", tuple(self.values))
    _check(len(self.values) > 0, f"axis {self.key}: Choice needs at least one value")
    _check(
      all(isinstance(v, _CHOICE_TYPES) for v in self.values),
      f"axis {self.key}: Choice values must be numbers, strings, booleans or None, got "
      f"{self.values!r}",
    )
    _check(
      len(set(map(repr, self.values))) == len(self.values),
      f"axis {self.key}: Choice values repeat: {self.values!r}",
    )

  def distribution(self):
    from optuna.distributions import CategoricalDistribution

    return CategoricalDistribution(self.values)

  def grid(self) -> tuple:
    return self.values

  def samples(self) -> tuple:
    return self.values

  @property
  def numeric(self) -> bool:
    return all(_finite(v) for v in self.values)

  @property
  def log(self) -> bool:
    return False


@dataclasses.dataclass(frozen=True)
class Uniform:
  """A float drawn uniformly from [low, high]."""

  key: str
  low: float
  high: float

  def __post_init__(self):
    _check(
      _finite(self.low) and _finite(self.high) and self.low < self.high,
      f"axis {self.key}: {type(self).__name__} needs finite low < high, got "
      f"[{self.low}, {self.high}]",
    )

  def distribution(self):
    from optuna.distributions import FloatDistribution

    return FloatDistribution(float(self.low), float(self.high), log=self.log)

  def grid(self) -> tuple:
    raise ConfigError(
      f"axis {self.key}: a continuous axis has no grid; use Choice for "
      "strategy 'grid', or strategy 'random'/'tpe'"
    )

  def samples(self) -> tuple:
    return (float(self.low), float(self.high))

  numeric = True

  @property
  def log(self) -> bool:
    return False


@dataclasses.dataclass(frozen=True)
class LogUniform(Uniform):
  """A float whose logarithm is uniform on [log low, log high] (learning rates)."""

  def __post_init__(self):
    super().__post_init__()
    _check(self.low > 0, f"axis {self.key}: LogUniform needs low > 0, got {self.low}")

  @property
  def log(self) -> bool:
    return True


@dataclasses.dataclass(frozen=True)
class IntRange:
  """An integer in low..high (both included) on a `step` lattice; `log` draws it
  log-uniformly (then step must be 1). Its grid is every value of the lattice."""

  key: str
  low: int
  high: int
  step: int = 1
  log: bool = False

  def __post_init__(self):
    _check(
      all(isinstance(v, int) and not isinstance(v, bool) for v in (self.low, self.high, self.step)),
      f"axis {self.key}: IntRange bounds and step must be ints",
    )
    _check(
      self.low <= self.high and self.step >= 1,
      f"axis {self.key}: IntRange needs low <= high and step >= 1",
    )
    _check(
      not self.log or (self.low >= 1 and self.step == 1),
      f"axis {self.key}: a log IntRange needs low >= 1 and step 1",
    )
    _check(
      (self.high - self.low) % self.step == 0,
      f"axis {self.key}: high - low must be a multiple of step",
    )

  def distribution(self):
    from optuna.distributions import IntDistribution

    return IntDistribution(self.low, self.high, step=self.step, log=self.log)

  def grid(self) -> tuple:
    return tuple(range(self.low, self.high + 1, self.step))

  def samples(self) -> tuple:
    return (self.low, self.high)

  numeric = True


Axis = Choice | Uniform | LogUniform | IntRange


@dataclasses.dataclass(frozen=True)
class Pruning:
  """Early stopping of hopeless trials on their held-out eval curve (an Optuna pruner).

  The trainer writes `eval_accuracy` (and the other eval fields) into metrics.jsonl every
  `eval.every_seconds` training seconds; the sweep reads the rows of `phase` as they appear
  and reports `key` as intermediate value number k = round(train_seconds / every_seconds),
  so that trials are compared at equal training time. A trial the pruner stops is recorded
  as 'pruned'. `key` must move in the same direction as the sweep's metric.

  kind 'median': Optuna's MedianPruner (stop a trial below the median of earlier trials at
  the same k) after `startup_trials` trials have finished and from the `warmup_evals`-th
  eval on. 'halving': SuccessiveHalvingPruner (asynchronous successive halving), which
  needs no aligned steps.
  """

  kind: str = "median"
  phase: str = "rl"
  key: str = "eval_accuracy"
  startup_trials: int = 4
  warmup_evals: int = 1

  def __post_init__(self):
    _check(self.kind in PRUNERS, f"pruning.kind {self.kind!r} unknown; known: {PRUNERS}")
    _check(bool(self.phase) and bool(self.key), "pruning.phase and pruning.key must be set")
    _check(
      self.startup_trials >= 0 and self.warmup_evals >= 0,
      "pruning.startup_trials and warmup_evals must be >= 0",
    )

  def make(self):
    import optuna

    if self.kind == "median":
      return optuna.pruners.MedianPruner(
        n_startup_trials=self.startup_trials, n_warmup_steps=self.warmup_evals
      )
    return optuna.pruners.SuccessiveHalvingPruner(min_resource=max(1, self.warmup_evals))


@dataclasses.dataclass(frozen=True)
class Sweep:
  """A declarative sweep (see the module docstring for the vocabulary).

  name: Optuna study name, W&B group of its trials, file-name safe.
  config: the base experiment config, 'path/to/config.py:variant' (relative to the working
    directory, else to the sweep file).
  axes: what varies (Choice, Uniform, LogUniform, IntRange), each over one dotted config key.
  fixed: 'key=value' overrides applied to every trial (like `--set`).
  seeds: runs per point, with seeds first_seed..first_seed+seeds-1.
  first_seed: 0, unless the sweep's seeds must be disjoint from another experiment's (a
    benchmark whose settings the sweep tunes runs seeds of its own).
  metric, direction: a dotted path into summary.json (e.g. 'rl.accuracy'); maximize/minimize.
  strategy: 'grid' (every point of the product of the axes' grids, in order), 'oat' (one
    at a time, a sensitivity analysis: the base point, made of each axis's first grid value,
    then every other value of one axis with the rest at the base), 'random', or 'tpe'
    (Optuna's tree-structured Parzen estimator after `startup_points` random points).
  points: how many points to run (times `seeds` trials); 0 with 'grid' or 'oat' means all.
  report: more summary.json paths to put in the table beside the metric.
  trial_timeout_s: a trial running longer is stopped and recorded as failed (0: no limit).
  shared_sft: every trial of one seed starts from one SFT run of that seed (the base config
    with the fixed overrides and the seed, RL off), trained once into DIR/sft/seed<s> before
    the seed's first trial (sft.steps / sft.max_seconds in `fixed` set its budget); the trials
    run with sft.steps=0 and init_from its final SFT snapshot, and report its summary's "sft"
    as their own. SFT is deterministic on a CPU,
    so this is the same start as each trial training its own, minus the repeats; the axes
    must not touch what SFT depends on (only rl.*, sao.*, samplers.*, transport.*).
  trial_fixed: overrides of the trials alone, after the shared start's (shared_sft only).
    Setting sft.steps or sft.max_seconds there makes each trial continue SFT from the start
    (e.g. `sft.max_seconds=120`, `rl.max_seconds=0`: the continued-SFT baseline), and then
    the axes may set sft.* too (its learning rate: the start is trained without the axes).
  """

  name: str
  config: str
  axes: tuple[Axis, ...] = ()
  fixed: tuple[str, ...] = ()
  seeds: int = 1
  first_seed: int = 0
  metric: str = "rl.accuracy"
  direction: str = "maximize"
  strategy: str = "tpe"
  points: int = 0
  sampler_seed: int = 0
  startup_points: int = 4
  pruning: Pruning | None = None
  report: tuple[str, ...] = ()
  trial_timeout_s: float = 0.0
  shared_sft: bool = False
  trial_fixed: tuple[str, ...] = ()

  def __post_init__(self):
    for f in ("axes", "fixed", "report", "trial_fixed"):
      object.__setattr__(self, f, tuple(getattr(self, f)))
    _check(
      bool(self.name) and all(c.isalnum() or c in "-_" for c in self.name),
      f"sweep name {self.name!r}: letters, digits, - and _ only",
    )
    _check(bool(self.config), "sweep.config must name the base config file")
    _check(
      all(isinstance(a, (Choice, Uniform, IntRange)) for a in self.axes),
      "sweep.axes must be Choice, Uniform, LogUniform or IntRange",
    )
    keys = [a.key for a in self.axes]
    _check(len(set(keys)) == len(keys), f"sweep axes repeat a key: {keys}")
    _check("seed" not in keys, "seed is not an axis: set sweep.seeds (seeds 0..seeds-1)")
    for field in ("fixed", "trial_fixed"):
      for pair in getattr(self, field):
        k, sep, _ = pair.partition("=")
        _check(bool(sep) and bool(k.strip()), f"sweep.{field} expects key=value, got {pair!r}")
        _check(k.strip() not in keys, f"{k.strip()} is both {field} and an axis")
        _check(k.strip() != "seed", f"seed cannot be fixed (sweep.{field}): set sweep.seeds")
    trial_keys = {pair.partition("=")[0].strip() for pair in self.trial_fixed}
    _check(
      not self.trial_fixed or self.shared_sft,
      "sweep.trial_fixed is for shared_sft sweeps (otherwise put the overrides in fixed)",
    )
    _check("init_from" not in trial_keys, "sweep.trial_fixed cannot set init_from")
    if self.shared_sft:
      # Trials that continue SFT may vary it; the start itself never sees the axes.
      free = SFT_FREE + (("sft.",) if trial_keys & {"sft.steps", "sft.max_seconds"} else ())
      bad = [k for k in keys if not k.startswith(free)]
      _check(not bad, f"sweep.shared_sft: axes {bad} may change the SFT start (only {free})")
      # (fixed's sft.steps / sft.max_seconds shape the shared start alone: the trials run
      # with sft.steps=0 after them)
      fixed_keys = [pair.partition("=")[0].strip() for pair in self.fixed]
      _check("init_from" not in fixed_keys, "sweep.shared_sft sets init_from itself: do not fix it")
    _check(self.seeds >= 1, "sweep.seeds must be >= 1")
    _check(self.first_seed >= 0, "sweep.first_seed must be >= 0")
    _check(
      self.direction in ("maximize", "minimize"),
      f"sweep.direction {self.direction!r}: maximize or minimize",
    )
    _check(
      bool(self.metric) and "" not in self.metric.split("."),
      f"sweep.metric {self.metric!r} must be a dotted path like 'rl.accuracy'",
    )
    _check(
      all(r and "" not in r.split(".") for r in self.report),
      f"sweep.report entries must be dotted paths, got {self.report!r}",
    )
    taken = [c for c in (self.metric, *self.report, *keys) if c in TABLE_COLUMNS]
    _check(not taken, f"sweep: {taken} would clash with the table's own columns {TABLE_COLUMNS}")
    _check(
      self.strategy in STRATEGIES,
      f"sweep.strategy {self.strategy!r} unknown; known: {', '.join(STRATEGIES)}",
    )
    _check(
      self.points >= 0 and self.startup_points >= 1,
      "sweep.points must be >= 0 and startup_points >= 1",
    )
    _check(self.trial_timeout_s >= 0, "sweep.trial_timeout_s must be >= 0")
    _check(
      self.pruning is None or isinstance(self.pruning, Pruning),
      "sweep.pruning must be a Pruning or None",
    )
    if self.strategy in ("grid", "oat"):
      _check(
        self.strategy == "grid" or len(self.axes) > 0, "strategy 'oat' needs at least one axis"
      )
      size = self.grid_size()
      _check(self.points <= size, f"sweep.points {self.points} > the grid's {size} points")
    else:
      _check(self.points > 0, f"strategy {self.strategy!r} needs a budget: set sweep.points")
      _check(len(self.axes) > 0, f"strategy {self.strategy!r} needs at least one axis")

  def grid_size(self) -> int:
    if self.strategy == "oat":
      return 1 + sum(len(a.grid()) - 1 for a in self.axes)
    return math.prod(len(a.grid()) for a in self.axes)

  @property
  def num_points(self) -> int:
    return self.points or self.grid_size()

  @property
  def num_trials(self) -> int:
    return self.num_points * self.seeds

  def grid(self) -> list[dict[str, Any]]:
    """Every point of the grid, in order (the last axis varies fastest); under 'oat', the
    base point, then one axis at a time."""
    if self.strategy == "oat":
      base = {a.key: a.grid()[0] for a in self.axes}
      return [base] + [dict(base, **{a.key: v}) for a in self.axes for v in a.grid()[1:]]
    return [
      dict(zip([a.key for a in self.axes], values, strict=True))
      for values in itertools.product(*(a.grid() for a in self.axes))
    ]

  def distributions(self) -> dict[str, Any]:
    """Axis key -> Optuna distribution."""
    return {a.key: a.distribution() for a in self.axes}

  def to_dict(self) -> dict:
    d = dataclasses.asdict(self)
    d["axes"] = [dict(kind=type(a).__name__, **dataclasses.asdict(a)) for a in self.axes]
    return d


def split_variant(path: str, default: str = "default") -> tuple[str, str]:
  """'file.py:variant' -> (file.py, variant); a path that exists as given keeps its colons."""
  if ":" in path and not pathlib.Path(path).exists():
    path, variant = path.rsplit(":", 1)
    return path, variant
  return path, default


def load_sweep(path: str) -> tuple[Sweep, pathlib.Path]:
  """Runs `get_sweep(variant)` of a sweep file; returns the sweep and the file's path."""
  file_name, variant = split_variant(path)
  file = pathlib.Path(file_name)
  _check(file.is_file(), f"sweep file {file_name!r} not found")
  spec = importlib.util.spec_from_file_location(f"sao_jax_sweep_{file.stem}", file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  _check(hasattr(module, "get_sweep"), f"{file_name} defines no get_sweep(variant)")
  sweep = module.get_sweep(variant)
  _check(
    isinstance(sweep, Sweep), f"{file_name}:get_sweep returned {type(sweep).__name__}, not Sweep"
  )
  return sweep, file.resolve()


def resolve_base(sweep: Sweep, sweep_file: pathlib.Path) -> tuple[pathlib.Path, str]:
  """The base config file (absolute) and variant: relative to the working directory, else
  to the sweep file's folder."""
  name, variant = split_variant(sweep.config)
  for root in (pathlib.Path.cwd(), sweep_file.parent):
    candidate = (root / name).resolve()
    if candidate.is_file():
      return candidate, variant
  raise ConfigError(
    f"sweep {sweep.name}: base config {name!r} not found (looked in "
    f"{pathlib.Path.cwd()} and {sweep_file.parent})"
  )


def format_value(v: Any) -> str:
  """A value as `--set` parses it back (ast.literal_eval): repr, also for strings."""
  return repr(v)


def trial_overrides(
  sweep: Sweep, params: dict[str, Any], seed: int, sweep_dir: pathlib.Path | None = None
) -> list[str]:
  """The trial's `--set` overrides: the fixed ones, its point, and its seed (`seed` is the
  trial's index among its point's seeds, 0..seeds-1; the run's seed is first_seed + it);
  with `shared_sft`, the start from its seed's SFT run under `sweep_dir`."""
  out = [
    *sweep.fixed,
    *(f"{a.key}={format_value(params[a.key])}" for a in sweep.axes),
    f"seed={sweep.first_seed + seed}",
  ]
  if sweep.shared_sft:
    start = shared_sft_dir(sweep_dir, sweep.first_seed + seed) / "checkpoints" / "sft"
    out += [f"init_from={str(start)!r}", "sft.steps=0", "sft.max_seconds=0.0"]
    out += sweep.trial_fixed  # (after: a trial may continue SFT)
  return out


def shared_sft_dir(sweep_dir: pathlib.Path | None, run_seed: int) -> pathlib.Path:
  if sweep_dir is None:
    raise ValueError("a shared_sft sweep's trials need the sweep's directory")
  return pathlib.Path(sweep_dir) / "sft" / f"seed{run_seed}"


def check_against_base(sweep: Sweep, base: pathlib.Path, variant: str) -> config_lib.Config:
  """Loads base + fixed overrides and checks each axis' extreme values against the config's
  types and validation, so that a typo fails here and not in every trial."""
  try:
    cfg = load_config(str(base), variant, overrides=[*sweep.fixed, *sweep.trial_fixed])
  except ConfigError as err:
    raise ConfigError(f"sweep {sweep.name}: base config with fixed overrides: {err}") from None
  for axis in sweep.axes:
    for v in axis.samples():
      try:
        validate(config_lib.apply_overrides(cfg, [f"{axis.key}={format_value(v)}"]))
      except ConfigError as err:
        raise ConfigError(f"sweep {sweep.name}: axis {axis.key} value {v!r}: {err}") from None
  if sweep.pruning is not None and cfg.eval.every_seconds <= 0:
    raise ConfigError(
      f"sweep {sweep.name}: pruning reads the eval curve, which needs "
      "eval.every_seconds > 0 (set it in the config or sweep.fixed)"
    )
  return cfg


def _summary_of(workdir: pathlib.Path) -> dict:
  try:
    return json.loads((workdir / "summary.json").read_text())
  except (OSError, json.JSONDecodeError):
    return {}


def lookup(summary: dict, path: str) -> Any:
  """summary['rl']['accuracy'] for 'rl.accuracy'; KeyError names the missing part."""
  cur: Any = summary
  for part in path.split("."):
    if not isinstance(cur, dict) or part not in cur:
      raise KeyError(f"{path} (no {part!r})")
    cur = cur[part]
  return cur


# ---------------------------------------------------------------------------------------------
# Trial processes.


def default_parallel() -> int:
  return max(1, len(os.sched_getaffinity(0)))


TRIAL_ENV = "SAO_JAX_SWEEP_TRIAL"


def trial_env(threads: int, workdir: pathlib.Path) -> dict[str, str]:
  """Environment of a trial: XLA limited to `threads` intra-op threads (as the SAO samplers
  do), so that `parallel` trials share the cores instead of each spreading over all; and
  SAO_JAX_SWEEP_TRIAL=workdir, inherited by every process of the trial, by which a later run
  finds what an interrupted one left behind (`trial_processes`)."""
  flags = [
    f
    for f in os.environ.get("XLA_FLAGS", "").split()
    if not f.startswith("--xla_force_host_platform_device_count")
    and not f.startswith("intra_op_parallelism_threads")
    and not f.startswith("--xla_cpu_multi_thread_eigen")
  ]
  flags += ["--xla_cpu_multi_thread_eigen=false", f"intra_op_parallelism_threads={threads}"]
  return dict(
    os.environ, XLA_FLAGS=" ".join(flags), PYTHONUNBUFFERED="1", **{TRIAL_ENV: str(workdir)}
  )


def trial_processes(sweep_dir: pathlib.Path) -> list[int]:
  """Live processes started for a trial of the sweep in `sweep_dir` (by their environment;
  immune to pid reuse). After a `kill -9` of the sweep its trial leaders die with it
  (PR_SET_PDEATHSIG), but a child that does not watch its parent would run on."""
  prefix = f"{TRIAL_ENV}={sweep_dir / 'trials'}/".encode()
  out = []
  for d in pathlib.Path("/proc").iterdir():
    if not d.name.isdigit() or int(d.name) == os.getpid():
      continue
    try:
      env = (d / "environ").read_bytes().split(b"\0")
    except OSError:
      continue
    if any(e.startswith(prefix) for e in env) and _running(int(d.name)):
      out.append(int(d.name))
  return out


def _running(pid: int) -> bool:
  try:
    return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
  except OSError:
    return False


def kill_leftovers(sweep_dir: pathlib.Path, timeout: float = 10.0) -> int:
  """SIGKILLs the processes an interrupted run of this sweep left; returns how many."""
  pids = trial_processes(sweep_dir)
  for pid in pids:
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
  deadline = time.time() + timeout
  while any(_running(p) for p in pids) and time.time() < deadline:
    time.sleep(0.05)
  return len(pids)


def start_group(cmd: list[str], *, log: pathlib.Path, env: dict, cwd: str) -> subprocess.Popen:
  """Starts `cmd` as the leader of a new process group (so the whole trial, sampler
  processes included, can be stopped at once) that also dies if this process dies
  (PR_SET_PDEATHSIG via util-linux setpriv: a `kill -9` of the sweep leaves no trial
  behind; a trial's own children stop when it does)."""
  setpriv = shutil.which("setpriv")
  extra: dict[str, Any] = {}
  if setpriv:
    cmd = [setpriv, "--pdeathsig", "SIGKILL", "--", *cmd]
  else:
    from sao_jax.transport.broker import _die_with_parent

    extra["preexec_fn"] = _die_with_parent
  with open(log, "ab") as f:
    return subprocess.Popen(
      cmd,
      stdout=f,
      stderr=subprocess.STDOUT,
      stdin=subprocess.DEVNULL,
      env=env,
      cwd=cwd,
      start_new_session=True,
      **extra,
    )


def group_alive(pgid: int) -> bool:
  try:
    os.killpg(pgid, 0)
    return True
  except ProcessLookupError:
    return False
  except PermissionError:
    return True


def stop_group(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
  """SIGTERM to the trial's process group, SIGKILL to whatever is left after `grace_s`;
  reaps the leader and waits (briefly) until the group is empty."""
  stop_groups([proc], grace_s)


def stop_groups(procs: list[subprocess.Popen], grace_s: float = 5.0) -> None:
  """`stop_group` for several trials at once: every group gets SIGTERM first and they share
  one grace period, so a Ctrl-C with N trials running takes one grace, not N."""

  def signal_all(sig):
    for p in procs:
      try:
        os.killpg(p.pid, sig)
      except ProcessLookupError:
        pass

  signal_all(signal.SIGTERM)
  deadline = time.time() + grace_s
  while any(p.poll() is None for p in procs) and time.time() < deadline:
    time.sleep(0.05)
  signal_all(signal.SIGKILL)
  for p in procs:
    p.wait()
  deadline = time.time() + grace_s
  while any(group_alive(p.pid) for p in procs) and time.time() < deadline:
    time.sleep(0.05)


class JsonlTail:
  """New complete lines of a growing JSONL file (a line cut short stays for the next read)."""

  def __init__(self, path: pathlib.Path):
    self.path, self.offset, self.skipped = path, 0, 0

  def read(self) -> list[dict]:
    try:
      with open(self.path, "rb") as f:
        f.seek(self.offset)
        data = f.read()
    except FileNotFoundError:
      return []
    end = data.rfind(b"\n")
    if end < 0:
      return []
    self.offset += end + 1
    rows = []
    for line in data[:end].splitlines():
      if not line.strip():
        continue
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError:
        self.skipped += 1  # a line a crash cut short, continued by the resumed run
    return rows


@dataclasses.dataclass
class _Running:
  trial: Any  # optuna.Trial
  point: int
  seed: int
  workdir: pathlib.Path
  proc: subprocess.Popen
  started: float
  every_seconds: float
  tail: JsonlTail
  reported: set
  stop_reason: str = ""  # "pruned" / "timeout" once the sweep stopped it


# ---------------------------------------------------------------------------------------------
# The driver.


class SweepRunner:
  """Runs (or resumes) a sweep in `sweep_dir` with at most `parallel` trials at once.

  `train_cmd` is what a trial runs before `--config ... --set ... --workdir ...`:
  `sao-jax train` in this Python by default; a wrapper (a scheduler's launcher, a test's
  stand-in) takes the same arguments.
  """

  def __init__(
    self,
    sweep: Sweep,
    sweep_file: pathlib.Path,
    sweep_dir: str | pathlib.Path,
    *,
    parallel: int | None = None,
    show_progress: bool = True,
    poll_s: float = 0.25,
    train_cmd: tuple[str, ...] | None = None,
  ):
    self.sweep = sweep
    self.train_cmd = list(train_cmd or (sys.executable, "-m", "sao_jax.cli", "train"))
    self.dir = pathlib.Path(sweep_dir).resolve()
    self.base, self.variant = resolve_base(sweep, sweep_file)
    self.parallel = parallel or default_parallel()
    _check(self.parallel >= 1, "--parallel must be >= 1")
    cores = len(os.sched_getaffinity(0))
    self.threads = max(1, cores // self.parallel)
    self.show_progress, self.poll_s = show_progress, poll_s
    self.base_cfg = check_against_base(sweep, self.base, self.variant)
    if self.base_cfg.logging.wandb:
      from sao_jax.metrics import require_wandb

      require_wandb()
    self.study = None
    self._rerun: list[int] = []  # trial ids RUNNING in the journal when this run started
    self._lock_file = None

  # -- state in DIR --------------------------------------------------------------------------

  def _acquire(self) -> None:
    self.dir.mkdir(parents=True, exist_ok=True)
    self._lock_file = open(self.dir / "sweep.lock", "a+")
    try:
      fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      self._lock_file.seek(0)
      pid = self._lock_file.read().strip() or "?"
      self._lock_file.close()
      raise ConfigError(f"another sweep (pid {pid}) is running in {self.dir}") from None
    self._lock_file.seek(0)
    self._lock_file.truncate()
    self._lock_file.write(str(os.getpid()))
    self._lock_file.flush()

  def _release(self) -> None:
    if self._lock_file is not None:
      self._lock_file.close()
      self._lock_file = None

  def _check_same_sweep(self) -> None:
    """sweep.json pins what DIR holds; only the budget (points) may change on a rerun."""
    mine = json.loads(
      json.dumps(dict(self.sweep.to_dict(), base_config=str(self.base), base_variant=self.variant))
    )
    path = self.dir / "sweep.json"
    if path.exists():
      old = json.loads(path.read_text())
      # (a field added since DIR was written reads as its default there)
      defaults = {
        f.name: f.default
        for f in dataclasses.fields(Sweep)
        if f.default is not dataclasses.MISSING and isinstance(f.default, (bool, int, float))
      }
      diff = sorted(
        k
        for k in old.keys() | mine.keys()
        if k != "points" and old.get(k, defaults.get(k)) != mine.get(k)
      )
      if diff:
        shown = "; ".join(f"{k}: {old.get(k)!r} -> {mine.get(k)!r}" for k in diff[:3])
        raise ConfigError(
          f"{self.dir} holds a different sweep ({shown}); rerun the same "
          "sweep to resume it, or pass a new --dir"
        )
    path.write_text(json.dumps(mine, indent=2))

  def _repair_journal(self, journal: pathlib.Path) -> None:
    """This process holds DIR's lock, so a journal lock file left behind is stale (the
    holder was killed), and a last line without its newline was never acknowledged."""
    lock = pathlib.Path(str(journal) + ".lock")
    if lock.is_symlink() or lock.exists():
      lock.unlink()
    if journal.exists() and journal.stat().st_size:
      data = journal.read_bytes()
      if not data.endswith(b"\n"):
        with open(journal, "r+b") as f:
          f.truncate(data.rfind(b"\n") + 1)

  def _open_study(self):
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    journal = self.dir / "optuna.journal"
    self._repair_journal(journal)
    storage = JournalStorage(JournalFileBackend(str(journal)))
    study = optuna.create_study(
      storage=storage,
      study_name=self.sweep.name,
      direction=self.sweep.direction,
      load_if_exists=True,
    )
    # The sampler's random state is not in the journal: seeding it with the trial count
    # makes a resumed sweep draw new points instead of repeating the first run's draws.
    seed = (self.sweep.sampler_seed * 1_000_003 + len(study.trials)) % 2**31
    study.sampler = self._sampler(seed)
    study.pruner = self.sweep.pruning.make() if self.sweep.pruning else optuna.pruners.NopPruner()
    return study

  def _sampler(self, seed: int):
    import optuna

    if self.sweep.strategy == "tpe":
      return optuna.samplers.TPESampler(
        seed=seed, n_startup_trials=self.sweep.startup_points * self.sweep.seeds, constant_liar=True
      )
    # 'grid' enqueues every point itself (Optuna's GridSampler cannot run the enqueued
    # trials that carry the other seeds of a point); the sampler is then never consulted.
    return optuna.samplers.RandomSampler(seed=seed)

  def _event(self, **row) -> None:
    row["time"] = round(time.time(), 3)
    with open(self.dir / "events.jsonl", "a") as f:
      f.write(json.dumps(row) + "\n")

  # -- points and trials ---------------------------------------------------------------------

  def _points(self) -> dict[int, dict]:
    """point -> {'params': ..., 'seeds': {seed: trial number}} from the journal."""
    out: dict[int, dict] = {}
    for t in self.study.get_trials(deepcopy=False):
      if "point" in t.user_attrs:
        # A trial still waiting in the queue has its values only as fixed_params.
        params = dict(t.params or t.system_attrs.get("fixed_params", {}))
        p = out.setdefault(t.user_attrs["point"], {"params": params, "seeds": {}})
        p["seeds"][t.user_attrs.get("seed", 0)] = t.number
    return out

  def _enqueue(self, point: int, params: dict, seeds) -> None:
    for s in seeds:
      self.study.enqueue_trial(params, user_attrs={"point": point, "seed": s})

  def _reconcile(self) -> list[int]:
    """After a crash: trials RUNNING in the journal are to be re-run (their ids returned);
    one that never got its point attributes becomes seed 0 of a new point; a point that is
    missing seeds gets them enqueued."""
    from optuna.trial import TrialState

    running = []
    points = self._points()
    for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
      # Only a sampled point's first trial gets its attributes after creation (point,
      # then seed); enqueued trials carry them from the start.
      if "point" not in t.user_attrs:
        p = max(points, default=-1) + 1
        self.study._storage.set_trial_user_attr(t._trial_id, "point", p)
        points[p] = {"params": dict(t.params), "seeds": {0: t.number}}
      if "seed" not in t.user_attrs:
        self.study._storage.set_trial_user_attr(t._trial_id, "seed", 0)
      running.append(t._trial_id)
    for p, info in sorted(points.items()):
      missing = [s for s in range(self.sweep.seeds) if s not in info["seeds"]]
      if missing:
        self._enqueue(p, info["params"], missing)
    return running

  def _next_trial(self):
    """The next trial to run: a re-run after a crash, an enqueued seed, or a new point
    (within the budget); None when nothing is left."""
    import optuna
    from optuna.trial import TrialState

    if self._rerun:
      return optuna.Trial(self.study, self._rerun.pop(0))
    dists = self.sweep.distributions()
    if self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
      return self.study.ask(dists)
    points = self._points()
    if len(points) >= self.sweep.num_points:
      return None
    p = max(points, default=-1) + 1
    if self.sweep.strategy in ("grid", "oat"):
      seen = [info["params"] for info in points.values()]
      params = next(g for g in self.sweep.grid() if g not in seen)
      self._enqueue(p, params, range(self.sweep.seeds))
      return self.study.ask(dists)
    trial = self.study.ask(dists)
    trial.set_user_attr("point", p)
    trial.set_user_attr("seed", 0)
    self._enqueue(p, trial.params, range(1, self.sweep.seeds))
    return trial

  def _launch(self, trial) -> _Running | None:
    point, seed = trial.user_attrs["point"], trial.user_attrs["seed"]
    workdir = self.dir / "trials" / str(trial.number)
    workdir.mkdir(parents=True, exist_ok=True)
    overrides = trial_overrides(self.sweep, trial.params, seed, self.dir)
    if self.sweep.shared_sft:
      problem = self._shared_sft(self.sweep.first_seed + seed)
      if problem:
        self._finish_without_run(trial, point, seed, problem)
        return None
    try:
      cfg = config_lib.apply_overrides(self.base_cfg, overrides[len(self.sweep.fixed) :])
      if cfg.logging.wandb:
        overrides += [
          f"logging.wandb_group={self.sweep.name!r}",
          f"logging.wandb_name={f'{self.sweep.name}-t{trial.number}'!r}",
        ]
    except ConfigError as err:
      self._finish_without_run(trial, point, seed, f"config: {err}")
      return None
    attempt = trial.user_attrs.get("attempts", 0) + 1
    trial.set_user_attr("attempts", attempt)
    cmd = self._train_command(overrides, workdir)
    proc = start_group(
      cmd,
      log=workdir / "train.log",
      env=trial_env(self.threads, workdir),
      cwd=str(pathlib.Path.cwd()),
    )
    self._event(
      event="start", trial=trial.number, point=point, seed=seed, attempt=attempt, pid=proc.pid
    )
    reported = set(self.study._storage.get_trial(trial._trial_id).intermediate_values)
    return _Running(
      trial=trial,
      point=point,
      seed=seed,
      workdir=workdir,
      proc=proc,
      started=time.time(),
      every_seconds=cfg.eval.every_seconds,
      tail=JsonlTail(workdir / "metrics.jsonl"),
      reported=reported,
    )

  def _train_command(self, overrides: list[str], workdir: pathlib.Path) -> list[str]:
    """`sao-jax train` of the base config with `overrides` into `workdir`, also written to
    its command.json."""
    cmd = [
      *self.train_cmd,
      "--config",
      f"{self.base}:{self.variant}",
      *itertools.chain.from_iterable(("--set", o) for o in overrides),
      "--workdir",
      str(workdir),
      "--no-progress",
    ]
    (workdir / "command.json").write_text(json.dumps(cmd))
    return cmd

  def _shared_sft(self, run_seed: int) -> str:
    """Trains the SFT start of `run_seed` once (`Sweep.shared_sft`), waiting for it (a
    finished one is kept: a resumed sweep finds it). Returns a problem, or ''."""
    workdir = shared_sft_dir(self.dir, run_seed)
    if "sft" in _summary_of(workdir):
      return ""
    workdir.mkdir(parents=True, exist_ok=True)
    overrides = [*self.sweep.fixed, f"seed={run_seed}", "rl.steps=0", "rl.max_seconds=0.0"]
    cmd = self._train_command(overrides, workdir)
    self._event(event="sft_start", seed=run_seed)
    t0 = time.time()
    proc = start_group(
      cmd, log=workdir / "train.log", env=trial_env(self.threads, workdir), cwd=os.getcwd()
    )
    try:
      rc = proc.wait()
    finally:
      if proc.poll() is None:  # (interrupted: the whole group goes)
        stop_group(proc)
    ok = "sft" in _summary_of(workdir)
    self._event(event="sft_end", seed=run_seed, ok=ok, wall_s=round(time.time() - t0, 3))
    return "" if ok else f"the shared SFT run of seed {run_seed} failed (rc {rc}): {workdir}"

  def _finish_without_run(self, trial, point: int, seed: int, reason: str) -> None:
    from optuna.trial import TrialState

    trial.set_user_attr("status", "failed")
    trial.set_user_attr("reason", reason)
    trial.set_user_attr("wall_s", 0.0)
    self.study.tell(trial, state=TrialState.FAIL)
    self._event(event="end", trial=trial.number, point=point, seed=seed, status="failed")

  def _watch(self, r: _Running) -> None:
    """Feeds new eval-curve rows to the pruner; stops the trial if it says so, or on
    timeout."""
    timeout = self.sweep.trial_timeout_s
    if timeout and time.time() - r.started > timeout:
      r.stop_reason = "timeout"
      stop_group(r.proc)
      return
    pr = self.sweep.pruning
    if pr is None or r.every_seconds <= 0:
      return
    for row in r.tail.read():
      value, secs = row.get(pr.key), row.get("train_seconds")
      if row.get("phase") != pr.phase or not _finite(value) or not _finite(secs):
        continue
      k = round(secs / r.every_seconds)
      if k in r.reported:
        continue  # already reported (by this run, or before a restart)
      r.trial.report(float(value), k)
      r.reported.add(k)
      if r.trial.should_prune():
        r.stop_reason = "pruned"
        stop_group(r.proc)
        return

  def _finish(self, r: _Running) -> str:
    """Records the outcome of a trial whose process has ended; returns its status."""
    from optuna.trial import TrialState

    wall = time.time() - r.started
    rc = r.proc.returncode
    value, metrics, reason = None, {}, ""
    if r.stop_reason == "pruned":
      status, state = "pruned", TrialState.PRUNED
      reason = f"pruned at eval {max(r.reported)}"
    elif r.stop_reason == "timeout":
      status, state = "failed", TrialState.FAIL
      reason = f"timeout after {self.sweep.trial_timeout_s:g} s"
    elif rc != 0:
      status, state = "failed", TrialState.FAIL
      reason = f"exit code {rc}: {_last_line(r.workdir / 'train.log')}"
    else:
      run_seed = self.sweep.first_seed + r.seed
      status, state, value, metrics, reason = self._read_summary(r.workdir, run_seed)
    r.trial.set_user_attr("status", status)
    r.trial.set_user_attr("reason", reason)
    r.trial.set_user_attr("wall_s", round(wall, 3))
    r.trial.set_user_attr("returncode", rc)
    r.trial.set_user_attr("metrics", metrics)
    if state == TrialState.COMPLETE:
      self.study.tell(r.trial, value)
    else:
      self.study.tell(r.trial, state=state)
    self._event(
      event="end",
      trial=r.trial.number,
      point=r.point,
      seed=r.seed,
      status=status,
      value=value,
      wall_s=round(wall, 3),
    )
    return status

  def _read_summary(self, workdir: pathlib.Path, run_seed: int):
    from optuna.trial import TrialState

    path = workdir / "summary.json"
    try:
      summary = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
      return "failed", TrialState.FAIL, None, {}, f"no readable summary.json ({err})"
    if self.sweep.shared_sft and "sft" not in summary:  # its start's, as its own
      shared = _summary_of(shared_sft_dir(self.dir, run_seed))
      if "sft" in shared:
        summary["sft"] = shared["sft"]
    metrics = {}
    for p in (self.sweep.metric, *self.sweep.report):
      try:
        v = lookup(summary, p)
      except KeyError:
        continue
      if isinstance(v, (int, float)) and not isinstance(v, bool):
        metrics[p] = float(v)
    if self.sweep.metric not in metrics:
      return (
        "failed",
        TrialState.FAIL,
        None,
        metrics,
        f"metric {self.sweep.metric} missing from summary.json (or not a number)",
      )
    value = metrics[self.sweep.metric]
    if not math.isfinite(value):
      return "diverged", TrialState.FAIL, None, metrics, f"{self.sweep.metric} = {value}"
    return "complete", TrialState.COMPLETE, value, metrics, ""

  # -- the loop ------------------------------------------------------------------------------

  def run(self) -> dict:
    """Runs the sweep to the end of its budget, then writes the reports; returns the
    report's summary. Interrupted (Ctrl-C, SIGTERM, an error): every trial process is
    stopped and stays RUNNING in the journal, so that the next run re-runs it."""
    import tqdm

    from sao_jax import sweep_report

    self._acquire()
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    # Ctrl-C too, explicitly: a process started with SIGINT ignored (a background job of a
    # shell without job control) gets no KeyboardInterrupt from Python's default handler.
    previous_int = signal.signal(signal.SIGINT, _raise_interrupt)
    running: dict[int, _Running] = {}
    bar = None
    try:
      self._check_same_sweep()
      # The lock is ours, so any process of a trial of this sweep is a leftover: it must
      # not write into a workdir that its trial's re-run is about to use.
      left = kill_leftovers(self.dir)
      if left:
        print(
          f"sweep {self.sweep.name}: stopped {left} process(es) left by an interrupted run",
          flush=True,
        )
      self.study = self._open_study()
      self._rerun = self._reconcile()
      if self._rerun:
        print(
          f"sweep {self.sweep.name}: resuming; re-running {len(self._rerun)} interrupted trial(s)",
          flush=True,
        )
      done = sum(t.state.is_finished() for t in self.study.get_trials(deepcopy=False))
      bar = tqdm.tqdm(
        total=max(self.sweep.num_trials, done),
        initial=done,
        desc=f"sweep {self.sweep.name}",
        unit="trial",
        dynamic_ncols=True,
        disable=not self.show_progress,
      )
      counts: dict[str, int] = {}
      while True:
        while len(running) < self.parallel:
          trial = self._next_trial()
          if trial is None:
            break
          r = self._launch(trial)
          if r is None:
            bar.update(1)
            continue
          running[trial.number] = r
        if not running:
          break
        for number, r in list(running.items()):
          self._watch(r)
          if r.proc.poll() is None:
            continue
          stop_group(r.proc)  # whatever of its group outlived the leader
          status = self._finish(r)
          del running[number]
          counts[status] = counts.get(status, 0) + 1
          bar.set_postfix(counts, refresh=False)
          bar.update(1)
          sweep_report.write_tables(self)
        time.sleep(self.poll_s)
      return sweep_report.write_all(self)
    finally:
      stop_groups([r.proc for r in running.values()])
      for r in running.values():
        self._event(event="stopped", trial=r.trial.number, point=r.point, seed=r.seed)
      if bar is not None:
        bar.close()
      signal.signal(signal.SIGTERM, previous)
      signal.signal(signal.SIGINT, previous_int)
      if self.study is not None and running:
        sweep_report.write_tables(self)
      self._release()


def _raise_interrupt(*_):
  raise KeyboardInterrupt


def _last_line(path: pathlib.Path) -> str:
  try:
    lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()]
  except OSError:
    return "(no log)"
  return lines[-1][:300] if lines else "(empty log)"


def run_sweep(
  path: str, sweep_dir: str, *, parallel: int | None = None, show_progress: bool = True
) -> dict:
  """What `sao-jax sweep` calls."""
  sweep, file = load_sweep(path)
  return SweepRunner(sweep, file, sweep_dir, parallel=parallel, show_progress=show_progress).run()
