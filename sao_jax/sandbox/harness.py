"""The program that runs inside the sandbox: sets the limits, then runs a program and its tests.

Executed as `python -I -S -B -c <this file's source>` by `sao_jax.sandbox.runner`, so it uses
the standard library only and imports nothing from sao_jax (the package may not even be
readable by the sandbox's user). It reads one job, JSON, from stdin until EOF:

  {"program": str, "tests": [str], "nonce": str, "result_fd": int, "scratch": str,
   "guard": bool, "rlimits": {"cpu_s": int, "memory_bytes": int, "nproc": int,
   "file_bytes": int, "open_files": int}}

and reports on `result_fd`, one line per event, each `<kind> <nonce> <payload>`:

  R             ready: limits set, the program starts now (the wall clock starts here)
  E <text>      the program failed to compile or raised while loading (every test fails)
  T <i> <0|1>   test i ran: passed (1) or failed (0)
  F <i> <text>  why test i failed (first failure only)
  M             a MemoryError was raised (the address-space limit was hit)
  V <event>     the guard refused an operation (see `_DENIED`)
  D             done: every test ran

The nonce stops a program from printing a fake verdict onto the channel by accident or by
guessing, but the program runs in this interpreter and could dig it out of memory: the
verdict is as trustworthy as in-process test execution, the trust model HumanEval's own
harness has. The real barriers are outside this process: namespaces, read-only mounts and
rlimits (set here, before any untrusted code runs, and irreversible for it).

The guard is an audit hook (PEP 578) that turns Python-level attempts at forbidden operations
(sockets, processes, signals, writes outside scratch) into a PermissionError and a `V` line,
so such a run is reported as "blocked" rather than as an ordinary failure. Code that goes
around it (ctypes, native code) still meets the kernel-level barriers.
"""

import json
import os
import resource
import sys

# Audit events refused outright. "socket.__new__" covers every socket, AF_UNIX included
# (abstract unix sockets are not stopped by read-only mounts).
_DENIED = frozenset(
  {
    "socket.__new__",
    "os.fork",
    "os.forkpty",
    "os.posix_spawn",
    "os.posix_spawnp",
    "os.exec",
    "os.spawn",
    "os.system",
    "subprocess.Popen",
    "os.kill",
    "os.killpg",
    "signal.pthread_kill",
    "pty.spawn",
  }
)
# Audit events whose first argument is a path that is modified: refused outside scratch.
_PATH_MUTATORS = frozenset(
  {
    "os.remove",
    "os.rmdir",
    "os.mkdir",
    "os.rename",
    "os.chmod",
    "os.chown",
    "os.link",
    "os.symlink",
    "os.truncate",
    "os.utime",
    "shutil.rmtree",
    "shutil.copyfile",
    "shutil.copytree",
    "shutil.move",
    "shutil.chown",
  }
)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_MAX_TEXT = 300


def _set_rlimits(lim):
  cpu = int(lim["cpu_s"])
  # Soft limit: SIGXCPU (reported as a timeout); the hard limit a second later is SIGKILL for
  # a program that ignores SIGXCPU.
  resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
  resource.setrlimit(resource.RLIMIT_AS, (lim["memory_bytes"], lim["memory_bytes"]))
  resource.setrlimit(resource.RLIMIT_NPROC, (lim["nproc"], lim["nproc"]))
  resource.setrlimit(resource.RLIMIT_FSIZE, (lim["file_bytes"], lim["file_bytes"]))
  resource.setrlimit(resource.RLIMIT_NOFILE, (lim["open_files"], lim["open_files"]))
  resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _make_emit(fd, nonce):
  prefix = " " + nonce + " "

  def emit(kind, payload=""):
    text = " ".join(str(payload).split())[:_MAX_TEXT]
    try:
      os.write(fd, (kind + prefix + text + "\n").encode("utf-8", "replace"))
    except OSError:
      pass  # the runner went away; nothing left to tell

  return emit


def _make_guard(scratch, emit):
  scratch = os.path.realpath(scratch)

  def outside_scratch(path):
    if isinstance(path, int):  # an already open file descriptor
      return False
    try:
      real = os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
      return True
    return real != scratch and not real.startswith(scratch + os.sep)

  def deny(event):
    emit("V", event)
    raise PermissionError(f"sandbox: {event} is not allowed")

  def hook(event, args):
    if event in _DENIED:
      deny(event)
    elif event == "open":
      path, mode, flags = args
      writes = (mode is not None and any(c in mode for c in "wax+")) or (
        mode is None and isinstance(flags, int) and flags & _WRITE_FLAGS
      )
      if writes and outside_scratch(path):
        deny(f"open for writing {path!r}")
    elif event in _PATH_MUTATORS and args and outside_scratch(args[0]):
      deny(f"{event} {args[0]!r}")

  return hook


def _describe(err):
  return f"{type(err).__name__}: {err}"


def _flush_std():
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except BaseException:  # a broken stream must not lose the verdict
      pass


def main():
  job = json.loads(sys.stdin.buffer.read())
  emit = _make_emit(int(job["result_fd"]), job.pop("nonce"))
  program, tests = job["program"], job["tests"]
  devnull = os.open(os.devnull, os.O_RDONLY)
  os.dup2(devnull, 0)
  os.close(devnull)
  keep = sorted({0, 1, 2, int(job["result_fd"])})
  for lo, hi in zip(keep, keep[1:] + [resource.getrlimit(resource.RLIMIT_NOFILE)[0]], strict=True):
    os.closerange(lo + 1, hi)
  _set_rlimits(job["rlimits"])
  if job["guard"]:
    sys.addaudithook(_make_guard(job["scratch"], emit))
  del job
  emit("R")
  namespace = {"__name__": "__sandbox__"}
  try:
    code = compile(program, "<program>", "exec")
    exec(code, namespace)
  except MemoryError:
    emit("M")
    emit("E", "MemoryError while loading the program")
    _flush_std()
    os._exit(0)
  except BaseException as err:  # SystemExit too: the program chose to stop
    emit("E", _describe(err))
    _flush_std()
    os._exit(0)
  failed_once = False
  for i, test in enumerate(tests):
    ok = 0
    try:
      exec(compile(test, f"<test {i}>", "exec"), namespace)
      ok = 1
    except MemoryError:
      emit("M")
    except BaseException as err:
      if not failed_once:
        emit("F", f"{i} {_describe(err)}")
        failed_once = True
    emit("T", f"{i} {ok}")
  _flush_std()
  emit("D")
  # Skips interpreter teardown: the program's atexit handlers and threads never run.
  os._exit(0)


if __name__ == "__main__":
  main()
