"""sao_jax.results_file: result documents with series, provenance and the resolved config,
written atomically, resumable part by part; config.upgrade for configs of older code."""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax import config as config_lib
from sao_jax import results_file as R
from sao_jax.config import Config, ModelConfig

ARGV = ["bench.py", "--quick"]


def _file(path, **kw) -> R.ResultFile:
  return R.ResultFile(path, series=kw.pop("series", "bench/a"), argv=ARGV, devices=False, **kw)


def test_round_trip_with_series_provenance_resolved_config_and_numpy_values(tmp_path):
  cfg = Config(model=ModelConfig(width=48))
  rf = _file(tmp_path / "sub" / "r.json", config=cfg, settings={"steps": 5})
  path = rf.finish({"acc": np.float32(0.5), "curve": jnp.arange(3), "n": np.int64(2)})
  assert path == tmp_path / "sub" / "r.json"
  text = path.read_text()
  doc = json.loads(text)
  assert text == json.dumps(doc, indent=2)
  assert list(doc)[:5] == ["schema", "series", "provenance", "config", "steps"]
  assert doc["schema"] == R.SCHEMA and doc["series"] == "bench/a" and doc["complete"]
  assert doc["provenance"]["command"] == "python bench.py --quick"
  assert doc["provenance"]["machine"]["cpu"]["model"]
  assert doc["config"]["model"]["width"] == 48  # the resolved config, not a path
  assert config_lib.from_dict(doc["config"]) == cfg
  assert (doc["acc"], doc["curve"], doc["n"]) == (0.5, [0, 1, 2], 2)
  assert R.load(path) == doc  # already the current schema: unchanged
  assert "done" not in doc  # a run written in one go has no parts


def test_write_is_atomic_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
  rf = _file(tmp_path / "r.json")
  rf.write({"a": 1}, done="a")
  before = (tmp_path / "r.json").read_text()
  with pytest.raises(TypeError, match="not JSON serialisable"):
    rf.finish({"bad": object()})
  assert (tmp_path / "r.json").read_text() == before
  assert os.listdir(tmp_path) == ["r.json"]
  assert (tmp_path / "r.json").stat().st_mode & 0o777 == 0o644  # readable as write_text's was


def test_resume_keeps_finished_parts_and_records_the_run_it_continued(tmp_path):
  path = tmp_path / "r.json"
  cfg = Config(seed=3)
  first = _file(path, config=cfg, settings={"steps": 5})
  first.put("part_a", {"x": 1})
  stopped = json.loads(path.read_text())
  assert not stopped["complete"] and stopped["done"] == "part_a"

  again = _file(path, config=cfg, settings={"steps": 5}, resume=True)
  assert again.has("part_a") and not again.has("part_b")
  assert again.kept["part_a"] == {"x": 1}
  for part in ("part_a", "part_b"):
    if not again.has(part):
      again.put(part, {"x": 2})
  again.finish({"part_a": again.kept["part_a"]})
  doc = json.loads(path.read_text())
  assert doc["complete"] and doc["done"] == "all"
  assert (doc["part_a"], doc["part_b"]) == ({"x": 1}, {"x": 2})
  assert doc["resumed_from"]["done"] == "part_a" and not doc["resumed_from"]["complete"]
  assert doc["resumed_from"]["commit"] == stopped["provenance"]["commit"]
  # Without a file there is nothing to keep: a fresh start.
  fresh = _file(tmp_path / "none.json", config=cfg, resume=True)
  assert fresh.kept == {} and "resumed_from" not in fresh.doc


def test_resume_refuses_another_series_settings_or_config(tmp_path):
  path = tmp_path / "r.json"
  _file(path, config=Config(), settings={"seed": 0}).write(done="a")
  with pytest.raises(R.ResultFileError, match="series: 'bench/a' there, 'bench/b' here"):
    _file(path, series="bench/b", config=Config(), settings={"seed": 0}, resume=True)
  with pytest.raises(R.ResultFileError, match="seed: 0 there, 1 here"):
    _file(path, config=Config(), settings={"seed": 1}, resume=True)
  with pytest.raises(R.ResultFileError, match=r"config \(differs in \['model'\]\)"):
    _file(path, config=Config(model=ModelConfig(width=8)), settings={"seed": 0}, resume=True)
  _file(path, config=Config(), settings={"seed": 0}, resume=True)  # the same run: accepted


def test_load_upgrades_an_old_format_document(tmp_path):
  """A file of schema 0: its config a path into some worktree, no series, provenance at the
  top level; or a resolved config missing fields added since."""
  old = {
    "command": "python x.py",
    "commit": "abc",
    "config": "/work/bench8/experiments/configs/longhorizon.py:default",
    "steps": 3,
  }
  (tmp_path / "old.json").write_text(json.dumps(old))
  doc = R.load(tmp_path / "old.json")
  assert doc["schema"] == R.SCHEMA and doc["series"] is None and "config" not in doc
  assert doc["config_file"] == "experiments/configs/longhorizon.py:default"
  assert doc["provenance"] == {"command": "python x.py", "commit": "abc"}
  assert doc["steps"] == 3

  resolved = json.loads(json.dumps(config_lib.to_dict(Config())))
  del resolved["compression"]["salient_turning"]
  del resolved["distributed"]
  (tmp_path / "cfg.json").write_text(json.dumps({"config": resolved, "provenance": {}}))
  doc = R.load(tmp_path / "cfg.json")
  assert config_lib.from_dict(doc["config"]) == Config()
  # An old file is resumed on its settings alone (it has neither series nor resolved config).
  (tmp_path / "old.json").write_text(json.dumps(dict(old, seed=0)))
  rf = _file(tmp_path / "old.json", config=Config(), settings={"seed": 0}, resume=True)
  assert rf.kept["steps"] == 3
  with pytest.raises(R.ResultFileError, match="newer"):
    R.upgrade({"schema": R.SCHEMA + 1})


def test_config_upgrade_fills_fields_added_since_at_their_defaults_at_any_depth():
  new = json.loads(json.dumps(config_lib.to_dict(Config(model=ModelConfig(width=96)))))
  old = json.loads(json.dumps(new))
  del old["rl"]["optim"]["lr"]  # a field two sections deep
  del old["compression"]
  up = config_lib.upgrade(old)
  assert up == json.loads(json.dumps(config_lib.to_dict(Config(model=ModelConfig(width=96)))))
  assert "lr" not in old["rl"]["optim"]  # the caller's dict is left as it was
  with pytest.raises(config_lib.ConfigError, match="unknown config key 'gone'"):
    config_lib.from_dict(config_lib.upgrade(dict(old, gone=1)))  # unknown keys still refused
