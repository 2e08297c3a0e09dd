"""Ctrl-C that stops a run between steps, not inside another library's write.

A KeyboardInterrupt raised wherever the main thread happens to be can land inside a
TensorBoard queue write, a Kafka send or a checkpoint's finalisation and leave that library
half-way (a run once hung for good in TensorBoard's close). Inside `at_step_boundaries()` the
first Ctrl-C only asks to stop: the training loops call `check()` where stopping is safe (the
start of each step, each pass of a wait for trajectories, before restarting a sampler) and
the KeyboardInterrupt is raised there, so the run's usual clean-up follows. A second Ctrl-C
raises at once, for a step that takes too long (a long evaluation, a first compile).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

_requested = threading.Event()

_MESSAGE = (
  "sao-jax: Ctrl-C: stopping at the end of this step (snapshots so far are kept); "
  "press Ctrl-C again to stop now"
)


def requested() -> bool:
  """Whether a Ctrl-C is waiting for a step boundary."""
  return _requested.is_set()


def check() -> None:
  """Raises KeyboardInterrupt where a Ctrl-C is waiting: call it where stopping is safe."""
  if _requested.is_set():
    raise KeyboardInterrupt


def _handler(signum, frame) -> None:
  if _requested.is_set():
    raise KeyboardInterrupt
  _requested.set()
  print(_MESSAGE, file=sys.stderr, flush=True)


@contextlib.contextmanager
def at_step_boundaries():
  """Within it, the first SIGINT is deferred to the next `check()`; the second raises at once.
  The previous handler is restored on exit, and a request never reached is dropped. Outside
  the main thread (where signal handlers cannot be set) it changes nothing."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  previous = signal.signal(signal.SIGINT, _handler)
  try:
    yield
  finally:
    signal.signal(signal.SIGINT, previous)
    _requested.clear()


def _raise(signum, frame) -> None:
  raise KeyboardInterrupt


def driver_signals() -> None:
  """For a script that drives training processes (an experiment): SIGTERM (a `kill`, a job
  scheduler) and SIGINT stop it like Ctrl-C, through the `finally` blocks that stop its
  process trees and brokers, which would otherwise outlive it. SIGINT is set too because a
  process started in the background by a non-interactive shell inherits it ignored."""
  signal.signal(signal.SIGTERM, _raise)
  signal.signal(signal.SIGINT, _raise)
