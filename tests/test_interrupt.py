"""Ctrl-C deferred to a step boundary (`sao_jax.interrupt`): the first SIGINT waits for a
`check()`, the second raises at once, and the training clock is such a boundary."""

import os
import signal
import subprocess
import sys
import time

import pytest

from sao_jax import interrupt
from sao_jax.runners.common import PhaseClock


def _sigint_and_wait(until) -> None:
  os.kill(os.getpid(), signal.SIGINT)
  deadline = time.time() + 5
  while not until() and time.time() < deadline:  # the handler runs between bytecodes
    time.sleep(0.01)


def test_first_ctrl_c_waits_for_a_step_boundary_second_stops_at_once(capsys):
  before = signal.getsignal(signal.SIGINT)
  with interrupt.at_step_boundaries():
    interrupt.check()  # nothing waiting: no-op
    _sigint_and_wait(interrupt.requested)  # no KeyboardInterrupt here
    assert interrupt.requested()
    assert "stopping at the end of this step" in capsys.readouterr().err
    with pytest.raises(KeyboardInterrupt):
      interrupt.check()
    with pytest.raises(KeyboardInterrupt):  # the second one: at once
      _sigint_and_wait(lambda: False)
  # the previous handler is back and a request never reached is dropped
  assert signal.getsignal(signal.SIGINT) is before and not interrupt.requested()
  interrupt.check()


def test_the_training_clock_raises_a_waiting_ctrl_c():
  clock = PhaseClock(steps=10, max_seconds=0, eval_every=0, eval_fn=None)
  with interrupt.at_step_boundaries():
    assert clock.running(3)
    _sigint_and_wait(interrupt.requested)
    with pytest.raises(KeyboardInterrupt):
      clock.running(4)
  assert clock.running(4) and not clock.running(10)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_driver_started_in_the_background_stops_through_its_finally(sig):
  """A background job inherits SIGINT ignored, and SIGTERM would kill it outright: with
  `driver_signals` both raise KeyboardInterrupt, so the script's clean-up runs."""
  code = (
    "import time\n"
    "from sao_jax import interrupt\n"
    "interrupt.driver_signals()\n"
    "print('ready', flush=True)\n"
    "try:\n"
    "  time.sleep(60)\n"
    "finally:\n"
    "  print('cleaned up', flush=True)\n"
  )
  p = subprocess.Popen(
    [sys.executable, "-c", code],
    stdout=subprocess.PIPE,
    stderr=subprocess.DEVNULL,
    text=True,
    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
  )
  try:
    assert p.stdout.readline().strip() == "ready"
    time.sleep(0.2)
    p.send_signal(sig)
    out, _ = p.communicate(timeout=20)
  finally:
    if p.poll() is None:
      p.kill()
  assert "cleaned up" in out
