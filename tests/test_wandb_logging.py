"""Optional Weights & Biases logging in MetricsWriter (config section `logging`)."""

from __future__ import annotations

import sys

import pytest

from sao_jax import config as config_lib
from sao_jax.config import ConfigError, LoggingConfig
from sao_jax.metrics import MetricsWriter, read_jsonl


def test_logging_config_validates():
  with pytest.raises(ConfigError, match="wandb_mode 'cloud' unknown"):
    LoggingConfig(wandb_mode="cloud")
  with pytest.raises(ConfigError, match="wandb_project"):
    LoggingConfig(wandb_project="")
  cfg = config_lib.apply_overrides(
    config_lib.Config(), ["logging.wandb=True", "logging.wandb_group='g'"]
  )
  assert cfg.logging.wandb and cfg.logging.wandb_group == "g"
  # A config saved before the section existed still loads (defaults fill it in).
  d = config_lib.to_dict(config_lib.Config())
  del d["logging"]
  assert config_lib.from_dict(d).logging == LoggingConfig()


def test_wandb_absent_is_a_clear_error_and_off_needs_nothing(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` now raises ImportError
  with pytest.raises(ConfigError, match="needs the wandb package: pip install wandb"):
    MetricsWriter(tmp_path / "a", show_progress=False, logging=LoggingConfig(wandb=True))
  w = MetricsWriter(tmp_path / "b", show_progress=False, logging=LoggingConfig())
  w.write(1, {"loss": 0.5}, phase="rl")
  w.close()
  assert read_jsonl(tmp_path / "b" / "metrics.jsonl")[0]["loss"] == 0.5


def test_wandb_offline_run(tmp_path, monkeypatch):
  wandb = pytest.importorskip("wandb")
  monkeypatch.setenv("WANDB_SILENT", "true")
  for var in ("WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_MODE"):
    monkeypatch.delenv(var, raising=False)
  cfg = LoggingConfig(
    wandb=True, wandb_mode="offline", wandb_group="sweepname", wandb_name="trial-3"
  )
  w = MetricsWriter(
    tmp_path / "w", show_progress=False, logging=cfg, run_config={"rl": {"steps": 2}}
  )
  run = w._wandb
  assert run.group == "sweepname" and run.name == "trial-3"
  for step in (1, 2):
    w.write(step, {"loss": 1.0 / step, "accuracy": 0.25 * step}, phase="rl")
  w.write(2, {"eval_accuracy": 0.5}, phase="rl_eval")
  w.close()
  runs = list((tmp_path / "w" / "wandb").glob("offline-run-*"))
  assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
  assert wandb.run is None  # finished
