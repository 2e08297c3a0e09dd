"""Run metrics: one JSON line per logged step, TensorBoard events, a console progress bar,
and a final summary.json. Everything a plot or a notebook needs is in the workdir.
Optionally (config `logging.wandb`) the same rows also go to Weights & Biases."""

from __future__ import annotations

import hashlib
import json
import math
import pathlib
import resource
import sys
import threading
import time
from typing import Any

import numpy as np
import tqdm
from tensorboardX import SummaryWriter


def peak_memory_mb() -> float:
  """Peak resident memory of this process (Linux ru_maxrss is in KiB)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _plain(v: Any):
  if isinstance(v, (np.generic, np.ndarray)) or hasattr(v, "__array__"):
    v = np.asarray(v)
    return v.item() if v.ndim == 0 else v.tolist()
  return v


def require_wandb():
  """The wandb module, or a ConfigError that says how to get it."""
  try:
    import wandb
  except ImportError:
    from sao_jax.config import ConfigError

    raise ConfigError(
      "logging.wandb=True needs the wandb package: pip install wandb "
      "(or the sao_jax[wandb] extra), or set logging.wandb=False"
    ) from None
  return wandb


def _start_wandb(logging, workdir: pathlib.Path, run_config: dict | None):
  wandb = require_wandb()
  # One W&B run per workdir: a resumed run (same workdir) continues it.
  run_id = hashlib.sha1(str(workdir.resolve()).encode()).hexdigest()[:16]
  return wandb.init(
    project=logging.wandb_project,
    entity=logging.wandb_entity or None,
    group=logging.wandb_group or None,
    name=logging.wandb_name or workdir.name,
    id=run_id,
    resume="allow",
    mode=logging.wandb_mode,
    dir=str(workdir),
    config=run_config,
  )


class MetricsWriter:
  """Appends to `workdir/metrics.jsonl` and `workdir/tb/` (and a W&B run when
  `logging.wandb`); resumes by appending."""

  def __init__(
    self,
    workdir: str | pathlib.Path,
    *,
    total: int | None = None,
    desc: str = "",
    show_progress: bool = True,
    logging=None,
    run_config: dict | None = None,
  ):
    self.workdir = pathlib.Path(workdir)
    self.workdir.mkdir(parents=True, exist_ok=True)
    self._wandb = (
      _start_wandb(logging, self.workdir, run_config)
      if logging is not None and logging.wandb
      else None
    )
    self._wandb_phases: set[str] = set()
    path = self.workdir / "metrics.jsonl"
    if path.exists() and path.stat().st_size:
      with open(path, "rb") as f:  # after a crash mid-line: start the next row on a new line
        f.seek(-1, 2)
        if f.read(1) != b"\n":
          with open(path, "a") as g:
            g.write("\n")
    self._jsonl = open(path, "a", buffering=1)
    self._tb = SummaryWriter(str(self.workdir / "tb"))
    self._bar = tqdm.tqdm(total=total, desc=desc, disable=not show_progress, dynamic_ncols=True)
    self.t0 = time.time()

  def progress(self, desc: str, total: int | None):
    self._bar.reset(total=total)
    self._bar.set_description(desc)

  def write(self, step: int, metrics: dict[str, Any], *, phase: str, advance: int = 1):
    row = {"phase": phase, "step": int(step), "wall_s": round(time.time() - self.t0, 3)}
    row.update({k: _plain(v) for k, v in metrics.items()})
    self._jsonl.write(json.dumps(row) + "\n")
    scalars = {
      k: v
      for k, v in row.items()
      if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }
    for k, v in scalars.items():
      self._tb.add_scalar(f"{phase}/{k}", v, step)
    if self._wandb is not None:
      if phase not in self._wandb_phases:  # each phase on its own step axis
        self._wandb.define_metric(f"{phase}/step")
        self._wandb.define_metric(f"{phase}/*", step_metric=f"{phase}/step")
        self._wandb_phases.add(phase)
      self._wandb.log({f"{phase}/{k}": v for k, v in scalars.items()})
    shown = {k: row[k] for k in ("loss", "reward", "accuracy") if k in row}
    self._bar.set_postfix({k: f"{v:.3g}" for k, v in shown.items()}, refresh=False)
    self._bar.update(advance)

  def tick(self, n: int = 1):
    self._bar.update(n)

  def close(self, tb_timeout_s: float = 30.0):
    """Closes the bar and the JSONL file (the record), then TensorBoard's event writer, waiting
    at most `tb_timeout_s` for it: a Ctrl-C that lands inside one of its queue writes can leave
    its writer thread never woken, and its close() then waits forever (seen once, a run
    interrupted by SIGINT hung for good at the end). Past the timeout the run goes on
    without it (its thread is a daemon) and says that the event file may lack its last rows;
    metrics.jsonl has them all."""
    self._bar.close()
    self._jsonl.close()
    closer = threading.Thread(target=self._tb.close, daemon=True, name="tensorboard-close")
    closer.start()
    closer.join(tb_timeout_s)
    if closer.is_alive():
      print(
        f"warning: TensorBoard's event writer did not close within {tb_timeout_s:.0f} s "
        "(interrupted mid-write?); its event file may lack the last rows, metrics.jsonl has "
        "them all",
        file=sys.stderr,
        flush=True,
      )
    if self._wandb is not None:
      self._wandb.finish()
      self._wandb = None


class SilentWriter(MetricsWriter):
  """A MetricsWriter that writes nothing: the one of every learner process but the first,
  so that a run over several hosts has one metrics.jsonl, one TensorBoard log, one W&B run."""

  def __init__(self):  # (no files opened, nothing to close)
    self.t0 = time.time()

  def progress(self, desc: str, total: int | None):
    pass

  def write(self, step: int, metrics: dict[str, Any], *, phase: str, advance: int = 1):
    pass

  def tick(self, n: int = 1):
    pass

  def close(self):
    pass


def write_summary(workdir: str | pathlib.Path, summary: dict[str, Any]) -> pathlib.Path:
  path = pathlib.Path(workdir) / "summary.json"
  path.write_text(json.dumps({k: _plain(v) for k, v in summary.items()}, indent=2, sort_keys=True))
  return path


def read_jsonl(path: str | pathlib.Path) -> list[dict]:
  """Rows of a metrics file; a line cut short by a crash is skipped."""
  out = []
  with open(path) as f:
    for line in f:
      if line.strip():
        try:
          out.append(json.loads(line))
        except json.JSONDecodeError:
          continue
  return out
