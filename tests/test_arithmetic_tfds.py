"""Tests for the TFDS builder of the arithmetic splits (no TensorFlow involved)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

from sao_jax.data.arithmetic_tfds import ArithmeticTasksConfig, load_tasks
from sao_jax.data.tfds_base import default_data_dir
from sao_jax.envs.arithmetic import ArithmeticSpec, make_split

_REPO = pathlib.Path(__file__).resolve().parents[1]


def test_round_trip_equals_make_split(tmp_path):
  spec = ArithmeticSpec(n_ops=3, max_operand=20, ops="+-*", reverse_digits=True)
  train = load_tasks(spec, "train", num_train=300, num_test=50, seed=1, data_dir=str(tmp_path))
  test = load_tasks(spec, "test", num_train=300, num_test=50, seed=1, data_dir=str(tmp_path))
  assert train == make_split(spec, "train", 300, seed=1, num_test=50)
  assert test == make_split(spec, "test", 50, seed=1)

  # A second call reads the built files instead of rebuilding them.
  data_file = next(tmp_path.glob("arithmetic_tasks/*/1.0.0/*-train.array_record*"))
  mtime = data_file.stat().st_mtime_ns
  assert load_tasks(spec, "train", 300, 50, seed=1, data_dir=str(tmp_path)) == train
  assert data_file.stat().st_mtime_ns == mtime


def test_a_first_build_leaves_nothing_in_the_temp_folder(tmp_path, monkeypatch):
  import tempfile

  scratch = tmp_path / "tmp"
  scratch.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(scratch))
  load_tasks(ArithmeticSpec(), "test", 20, 10, data_dir=str(tmp_path / "data"))
  assert list(scratch.iterdir()) == []


def test_each_spec_gets_its_own_config_dir(tmp_path):
  for reverse in (False, True):
    load_tasks(ArithmeticSpec(reverse_digits=reverse), "test", 20, 10, data_dir=str(tmp_path))
  assert sorted(p.name for p in (tmp_path / "arithmetic_tasks").iterdir()) == [
    "ops2_max9_pm_rev0_n20_t10_s0",
    "ops2_max9_pm_rev1_n20_t10_s0",
  ]


def test_config_name_encodes_spec_sizes_and_seed():
  config = ArithmeticTasksConfig.create(ArithmeticSpec(max_operand=20), 20000, 500, seed=0)
  assert config.name == "ops2_max20_pm_rev0_n20000_t500_s0"
  config = ArithmeticTasksConfig.create(
    ArithmeticSpec(n_ops=4, max_operand=99, ops="*+", reverse_digits=True), 10, 5, seed=3
  )
  assert config.name == "ops4_max99_pt_rev1_n10_t5_s3"


def test_default_data_dir_follows_env(monkeypatch, tmp_path):
  monkeypatch.setenv("SAO_JAX_DATA_DIR", str(tmp_path))
  assert default_data_dir() == str(tmp_path)
  monkeypatch.delenv("SAO_JAX_DATA_DIR")
  assert default_data_dir() == os.path.expanduser("~/.cache/sao_jax/tfds")


def test_build_and_read_import_no_tensorflow_and_stay_quiet(tmp_path):
  # In a fresh interpreter, so that no other test's imports can hide a TensorFlow import.
  script = textwrap.dedent(f"""
      import sys
      from sao_jax.data.arithmetic_tfds import load_tasks
      from sao_jax.envs.arithmetic import ArithmeticSpec
      tasks = load_tasks(ArithmeticSpec(), "train", 200, 20, data_dir={str(tmp_path)!r})
      print(len(tasks), "tensorflow" in sys.modules)
  """)
  proc = subprocess.run(
    [sys.executable, "-c", script],
    cwd=_REPO,
    capture_output=True,
    text=True,
    timeout=120,
    check=True,
    env={**os.environ, "PYTHONPATH": str(_REPO)},
  )
  assert proc.stdout == "200 False\n"
  assert "Generating" not in proc.stderr and "custom data configuration" not in proc.stderr


def test_setup_mixture_interleaves_parts(tmp_path):
  """task.n_ops_mix: equal parts per number of operations, interleaved so that any prefix of
  the test split (what evaluation uses) is balanced."""
  from sao_jax.config import Config, EvalConfig, RLConfig, TaskConfig
  from sao_jax.setup import make_setup

  cfg = Config(
    task=TaskConfig(n_ops_mix=(2, 3), num_train=40, num_test=20, data_dir=str(tmp_path)),
    eval=EvalConfig(num_problems=20),
    rl=RLConfig(max_new_tokens=32),
  )
  s = make_setup(cfg)
  assert len(s.train) == 40 and len(s.test) == 20
  assert [t.solution.count("=") for t in s.test] == [2, 3] * 10
  assert {t.solution.count("=") for t in s.train} == {2, 3}
