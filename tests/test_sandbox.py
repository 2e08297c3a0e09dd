"""Security and behaviour tests of the code sandbox.

Every attack runs twice where the guard matters: with the guard (the audit hook) off, which
shows the kernel-level barriers hold on their own (namespaces, read-only mounts, rlimits,
the private uid), and with it on, which shows the run is reported as "blocked". Each test
checks the host afterwards (`host` fixture): no file of a sandbox user or carrying the
test's marker in the watched places, no process of a sandbox user, no new child of this
process.
"""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import threading
import time
import uuid
import warnings

import pytest

from sao_jax.sandbox import (
  Job,
  Limits,
  SandboxIsolationWarning,
  SandboxPool,
  resolve_isolation,
  run_job,
)
from sao_jax.sandbox.runner import UID_BASE, _uids_processes

REPO = pathlib.Path(__file__).resolve().parents[1]
WATCHED = (pathlib.Path.home(), REPO, pathlib.Path("/tmp"))
FAST = Limits(wall_s=1.0, cpu_s=1, memory_mb=256)


@pytest.fixture(scope="module")
def iso():
  iso = resolve_isolation("auto")
  if iso.mode != "bwrap":
    pytest.skip(f"bubblewrap does not work on this machine: {iso.reason}")
  return iso


@pytest.fixture(scope="module")
def fallback():
  return resolve_isolation("rlimits")


def _children(pid: int) -> set[int]:
  out = set()
  for d in pathlib.Path("/proc").iterdir():
    if d.name.isdigit():
      try:
        if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
          out.add(int(d.name))
      except (OSError, IndexError, ValueError):
        pass
  return out


def _cmdlines_with(text: str) -> list[int]:
  found = []
  for d in pathlib.Path("/proc").iterdir():
    if d.name.isdigit():
      try:
        if text.encode() in (d / "cmdline").read_bytes():
          found.append(int(d.name))
      except OSError:
        pass
  return found


def _sandbox_owned(paths) -> list[str]:
  bad = []
  for p in paths:
    try:
      if p.lstat().st_uid >= UID_BASE:
        bad.append(str(p))
    except OSError:
      pass
  return bad


class Host:
  """What a test watches: a unique marker to plant in attacks, and the state to compare."""

  def __init__(self):
    self.marker = f"saosbx{uuid.uuid4().hex[:12]}"
    self.uids = [UID_BASE + os.getpid()]  # pool tests add their workers' uids
    self.before = {d: set(d.iterdir()) for d in WATCHED}
    self.children = _children(os.getpid())

  def check_unchanged(self):
    for d in WATCHED:
      new = set(d.iterdir()) - self.before[d]
      assert not [p for p in new if self.marker in p.name], f"sandbox wrote into {d}"
      assert not _sandbox_owned(new), f"a sandbox user created files in {d}"
    deadline = time.time() + 3
    while time.time() < deadline and (
      _cmdlines_with(self.marker) or any(map(_uids_processes, self.uids))
    ):
      time.sleep(0.05)
    assert not _cmdlines_with(self.marker), "a process of the attack outlived the run"
    assert not any(map(_uids_processes, self.uids)), "a sandbox process outlived the run"
    assert _children(os.getpid()) <= self.children, "the run left a child process behind"


@pytest.fixture
def host():
  h = Host()
  yield h
  h.check_unchanged()


def _run(iso, program, *, guard, limits=FAST, tests=()):
  return run_job(Job(program, tuple(tests), limits, guard=guard), iso)


# --- resource limits -------------------------------------------------------------------------


def test_infinite_loop_is_stopped_by_the_cpu_limit(iso, host):
  res = _run(iso, "while True: pass", guard=True, limits=Limits(wall_s=5, cpu_s=1))
  assert (res.status, res.detail) == ("timeout", "cpu limit of 1 s")
  assert res.wall_s < 4


def test_sleeping_program_is_stopped_by_the_wall_clock(iso, host):
  res = _run(iso, "import time\ntime.sleep(60)", guard=True, limits=Limits(wall_s=0.5))
  assert res.status == "timeout" and res.detail.startswith("wall clock")
  assert res.wall_s < 3


def test_timeout_keeps_the_tests_that_passed_before_it(iso, host):
  tests = ("assert f(1) == 1", "assert f(2) == 2", "import time\ntime.sleep(60)", "assert 1")
  res = _run(iso, "def f(x): return x", guard=True, tests=tests, limits=Limits(wall_s=0.5))
  assert (res.status, res.tests_passed, res.tests_total) == ("timeout", 2, 4)


def _count_while(uid: int, fn):
  """Runs fn() while sampling how many processes `uid` holds; returns (fn(), max count)."""
  peak, stop = [0], threading.Event()

  def sample():
    while not stop.is_set():
      peak[0] = max(peak[0], len(_uids_processes(uid)))
      time.sleep(0.01)

  t = threading.Thread(target=sample)
  t.start()
  try:
    return fn(), peak[0]
  finally:
    stop.set()
    t.join()


FORK_BOMB = "import os\nwhile True:\n  try:\n    os.fork()\n  except OSError:\n    pass\n"


def test_fork_bomb_is_capped_by_the_process_limit_and_fully_reaped(iso, host):
  limits = Limits(wall_s=1.0, cpu_s=2, nproc=16)
  res, peak = _count_while(
    UID_BASE + os.getpid(), lambda: _run(iso, FORK_BOMB, guard=False, limits=limits)
  )
  assert res.status == "timeout"
  # RLIMIT_NPROC holds inside the sandbox's user namespace; outside it only bwrap's own
  # monitor process runs as the sandbox uid.
  assert 3 <= peak <= limits.nproc + 1, peak
  assert _run(iso, FORK_BOMB, guard=True).status == "blocked"


def test_memory_bomb_is_stopped_by_the_address_space_limit(iso, host):
  for program in (
    "x = bytearray(1 << 36)",
    "chunks = []\nwhile True:\n  chunks.append(bytearray(1 << 20))",
  ):
    res = _run(iso, program, guard=False, limits=Limits(memory_mb=128))
    assert res.status == "memory", (program, res)


def test_huge_stdout_is_cut_at_the_output_limit(iso, host):
  limits = Limits(wall_s=10, output_bytes=4096)
  res = _run(iso, "while True:\n  print('x' * 10000)", guard=False, limits=limits)
  assert (res.status, res.detail) == ("blocked", "output over 4096 bytes")
  assert len(res.stdout) + len(res.stderr) <= 4096
  assert res.wall_s < 5


def test_ctypes_segfault_is_a_crash_of_the_sandbox_only(iso, host):
  res = _run(iso, "import ctypes\nctypes.string_at(0)", guard=True)
  assert (res.status, res.detail) == ("crashed", "killed by SIGSEGV")


# --- file system ----------------------------------------------------------------------------


def _writer(paths) -> str:
  lines = [
    "import os",
    "for p in %r:" % [str(p) for p in paths],
    "  try:",
    "    open(p, 'w').write('x')",
    "    print('WROTE', p)",
    "  except OSError as e:",
    "    print('DENIED', p, e.errno)",
  ]
  return "\n".join(lines)


def test_writes_outside_scratch_never_reach_the_host(iso, host):
  targets = [
    pathlib.Path.home() / host.marker,
    REPO / host.marker,
    pathlib.Path("/tmp") / host.marker,
  ]
  res = _run(iso, _writer(targets), guard=False)
  assert res.status == "passed", res
  out = res.stdout.splitlines()
  assert f"DENIED {targets[0]} 13" in out  # root's home: not even readable by the sandbox uid
  # EROFS: the host is mounted read-only; a checkout under /tmp is not there at all (ENOENT:
  # the sandbox's /tmp is its own scratch).
  repo_errno = 2 if REPO.is_relative_to("/tmp") else 30
  assert f"DENIED {targets[1]} {repo_errno}" in out
  assert f"WROTE {targets[2]}" in out  # the sandbox's own /tmp (scratch), a private tmpfs
  assert not any(p.exists() for p in targets)
  res = _run(iso, _writer(targets[:2]), guard=True)
  assert res.status == "blocked" and "open for writing" in res.detail


def test_host_service_sockets_under_run_are_hidden(iso, host):
  program = "import os\nprint(sorted(os.listdir('/run')))\nopen('/run/x', 'w')"
  res = _run(iso, program, guard=False)
  assert res.stdout == "[]\n" and "Read-only file system" in res.detail, res
  assert not pathlib.Path("/run/x").exists()


def test_scratch_is_writable_and_size_capped(iso, host):
  program = (
    "open('data', 'wb').write(b'x' * (1 << 20))\n"
    "assert len(open('/tmp/data', 'rb').read()) == 1 << 20\n"
    "open('big', 'wb').write(b'x' * (3 << 20))"
  )
  res = _run(iso, program, guard=True, limits=Limits(scratch_mb=2))
  assert res.status == "failed" and "EFBIG" not in res.detail
  assert "File too large" in res.detail or "No space left" in res.detail


# --- environment, descriptors, processes ------------------------------------------------------


def test_parent_environment_and_descriptors_are_not_visible(iso, host, monkeypatch, tmp_path):
  secret = f"{host.marker}secret"
  monkeypatch.setenv("SAO_SANDBOX_SECRET", secret)
  secret_file = tmp_path / "secret.txt"
  secret_file.write_text(secret)
  fd = os.open(secret_file, os.O_RDONLY)
  os.set_inheritable(fd, True)
  try:
    program = "\n".join(
      [
        "import os",
        "print(dict(os.environ))",
        f"for path in ('/proc/self/environ', '/proc/1/environ', '/proc/{os.getpid()}/environ',",
        "             '/proc/%d/environ' % os.getppid()):",
        "  try:",
        "    print(path, open(path, 'rb').read())",
        "  except OSError as e:",
        "    print(path, e)",
        "print('fds', os.listdir('/proc/self/fd'))",
        "for fd in range(3, 64):",
        "  try:",
        "    print(fd, os.pread(fd, 100, 0))",
        "  except OSError:",
        "    pass",
      ]
    )
    for guard in (False, True):
      res = _run(iso, program, guard=guard)
      assert res.status == "passed", res
      assert secret not in res.stdout + res.stderr
      assert "SAO_SANDBOX_SECRET" not in res.stdout
  finally:
    os.close(fd)


def test_kill_of_the_parent_or_a_sibling_cannot_reach_them(iso, host):
  sibling = subprocess.Popen(["sleep", "30"])
  try:
    program = "\n".join(
      [
        "import os, signal",
        f"for pid in ({os.getpid()}, {sibling.pid}, -1):",
        "  try:",
        "    os.kill(pid, signal.SIGKILL)",
        "    print('sent', pid)",
        "  except OSError as e:",
        "    print('denied', pid, e.errno)",
      ]
    )
    res = _run(iso, program, guard=False)
    # ESRCH for all three: the host's pids do not exist in the sandbox's pid namespace, and
    # kill(-1) (everything the caller may signal) finds nothing but the caller itself.
    assert res.stdout.split("\n")[:3] == [
      f"denied {os.getpid()} 3",
      f"denied {sibling.pid} 3",
      "denied -1 3",
    ], res
    time.sleep(0.1)
    assert sibling.poll() is None
    assert _run(iso, program, guard=True).status == "blocked"
    assert sibling.poll() is None
  finally:
    sibling.kill()
    sibling.wait()


def _daemon(marker_seconds: str) -> str:
  return "\n".join(
    [
      "import os, time",
      "if os.fork() == 0:",
      "  os.setsid()",
      "  if os.fork() == 0:",
      f"    os.execv('/bin/sleep', ['sleep', '{marker_seconds}'])",
      "  os._exit(0)",
      "time.sleep(0.3)",
    ]
  )


def test_daemonised_double_fork_does_not_outlive_the_run(iso, host):
  seconds = f"{int(host.marker[-8:], 16) % 90000 + 1000}.{os.getpid()}"
  host.marker = seconds  # the sleeper's command line carries it
  res = _run(iso, _daemon(seconds), guard=False)
  assert res.status == "passed", res
  assert _run(iso, _daemon(seconds), guard=True).status == "blocked"


# --- network --------------------------------------------------------------------------------


def test_no_connection_to_the_hosts_loopback(iso, host):
  with socket.socket() as listener:
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    program = "\n".join(
      [
        "import socket",
        "try:",
        f"  socket.create_connection(('127.0.0.1', {port}), timeout=2)",
        "  print('CONNECTED')",
        "except OSError as e:",
        "  print('REFUSED', e.errno)",
      ]
    )
    res = _run(iso, program, guard=False)
    assert res.stdout.strip() == "REFUSED 111"  # a fresh network namespace: nobody listens
    assert _run(iso, program, guard=True).status == "blocked"
    with pytest.raises(TimeoutError):
      listener.accept()


def test_no_route_to_external_addresses(iso, host):
  program = "\n".join(
    [
      "import socket",
      "for addr in (('8.8.8.8', 53), ('1.1.1.1', 443)):",
      "  try:",
      "    socket.create_connection(addr, timeout=2)",
      "    print('CONNECTED')",
      "  except OSError as e:",
      "    print('UNREACHABLE', e.errno)",
    ]
  )
  res = _run(iso, program, guard=False)
  assert res.stdout.split() == ["UNREACHABLE", "101"] * 2  # ENETUNREACH: no interface
  assert _run(iso, program, guard=True).status == "blocked"


# --- statuses and results -------------------------------------------------------------------


def test_statuses_and_test_counts(iso):
  program = "def f(x):\n  return x * 2"
  tests = ("assert f(1) == 2", "assert f(2) == 4", "assert f(3) == 7")
  res = run_job(Job(program, tests[:2]), iso)
  assert (res.status, res.tests_passed, res.tests_total) == ("passed", 2, 2)
  res = run_job(Job(program, tests), iso)
  assert (res.status, res.tests_passed, res.fraction_passed) == ("failed", 2, 2 / 3)
  res = run_job(Job("def f(x) return", tests), iso)
  assert res.status == "failed" and res.detail.startswith("SyntaxError")
  assert res.tests_passed == 0
  res = run_job(Job("import os\nos._exit(0)", tests), iso)
  assert res.status == "crashed" and "before its tests finished" in res.detail
  res = run_job(Job("print('hello')\nraise SystemExit(3)", tests), iso)
  assert (res.status, res.stdout, res.detail) == ("failed", "hello\n", "SystemExit: 3")


def test_a_forged_verdict_on_stdout_or_the_result_channel_is_ignored(iso):
  program = "\n".join(
    [
      "import os",
      "print('D x'); print('T x 0 1')",
      "for fd in range(3, 20):",
      "  try:",
      "    os.write(fd, b'T 0 0 1\\nD 0 \\n')",
      "  except OSError:",
      "    pass",
      "os._exit(0)",
    ]
  )
  res = run_job(Job(program, ("assert False",)), iso)
  assert (res.status, res.tests_passed) == ("crashed", 0)


# --- the fallback: rlimits and a fresh process ---------------------------------------------


def test_fallback_warns_once_when_bwrap_does_not_work(tmp_path):
  broken = tmp_path / "bwrap"
  broken.write_text("#!/bin/sh\nexit 1\n")
  broken.chmod(0o755)
  with pytest.warns(SandboxIsolationWarning, match="bubblewrap isolation is unavailable"):
    iso = resolve_isolation("auto", bwrap_path=str(broken))
  assert iso.mode == "rlimits"
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    assert resolve_isolation("auto", bwrap_path=str(broken)) is iso
  res = run_job(Job("def f(x): return x", ("assert f(3) == 3",)), iso)
  assert (res.status, res.isolation) == ("passed", "rlimits")
  with pytest.raises(RuntimeError, match="bubblewrap isolation does not work"):
    resolve_isolation("bwrap", bwrap_path=str(tmp_path / "missing"))


def test_fallback_contains_loops_memory_and_environment(fallback, host, monkeypatch):
  monkeypatch.setenv("SAO_SANDBOX_SECRET", host.marker)
  assert _run(fallback, "while True: pass", guard=False).status == "timeout"
  assert _run(fallback, "x = bytearray(1 << 36)", guard=False).status == "memory"
  res = _run(fallback, "import os\nprint(dict(os.environ))", guard=False)
  assert res.status == "passed" and host.marker not in res.stdout
  res = _run(fallback, "open('/etc/" + host.marker + "', 'w')", guard=True)
  assert res.status == "blocked"


@pytest.mark.skipif(os.geteuid() != 0, reason="the fallback reaps leftovers by uid as root")
def test_fallback_contains_a_fork_bomb_and_a_daemon(fallback, host):
  limits = Limits(wall_s=1.0, cpu_s=2, nproc=16)
  res, peak = _count_while(
    UID_BASE + os.getpid(), lambda: _run(fallback, FORK_BOMB, guard=False, limits=limits)
  )
  assert res.status == "timeout"
  assert 3 <= peak <= limits.nproc, peak
  seconds = f"{int(host.marker[-8:], 16) % 90000 + 1000}.{os.getpid()}"
  host.marker = seconds
  assert _run(fallback, _daemon(seconds), guard=False).status == "passed"


# --- the pool -------------------------------------------------------------------------------


def test_pool_scores_a_batch_concurrently_in_order_and_cleans_up(host):
  programs = [f"def f(x): return x + {i}" for i in range(6)] + ["while True: pass"]
  jobs = [Job(p, (f"assert f(1) == {i + 1}",), FAST) for i, p in enumerate(programs)]
  with SandboxPool(3) as pool:
    assert pool.num_workers == 3
    pids = pool.worker_pids()
    host.uids += [UID_BASE + pid for pid in pids]
    t0 = time.monotonic()
    results = pool.map(jobs)
    elapsed = time.monotonic() - t0
  assert [r.status for r in results] == ["passed"] * 6 + ["timeout"]
  assert elapsed < 5
  time.sleep(0.05)
  assert not any(pathlib.Path(f"/proc/{pid}").exists() and _alive(pid) for pid in pids)


def _alive(pid: int) -> bool:
  try:
    return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
  except OSError:
    return False


def test_pool_survives_a_worker_killed_mid_job_and_close_is_idempotent(host):
  pool = SandboxPool(1)
  host.uids.append(UID_BASE + pool.worker_pids()[0])
  try:
    fut = pool.submit(Job("import time\ntime.sleep(30)", (), Limits(wall_s=30)))
    time.sleep(0.5)
    os.kill(pool.worker_pids()[0], signal.SIGKILL)
    res = fut.result(timeout=10)
    assert res.status == "crashed" and "sandbox worker" in res.detail
    host.uids.append(UID_BASE + pool.worker_pids()[0])
    res = pool.map([Job("x = 2", ("assert x == 2",))])[0]
    assert res.status == "passed"
  finally:
    pool.close()
    pool.close()
  with pytest.raises(RuntimeError, match="closed"):
    pool.submit(Job("x = 1"))
