"""MetricsWriter: the JSONL record is complete and closing never hangs on TensorBoard."""

import threading
import time

from sao_jax.metrics import MetricsWriter, read_jsonl


class _StuckWriter:
  """A TensorBoard writer whose close() never returns (its worker thread never woken)."""

  def __init__(self, real):
    self.real, self.release = real, threading.Event()

  def close(self):
    self.release.wait()
    self.real.close()


def test_close_does_not_wait_forever_on_a_stuck_tensorboard_writer(tmp_path, capsys):
  w = MetricsWriter(tmp_path, show_progress=False)
  w.write(1, {"loss": 0.5}, phase="rl")
  stuck = w._tb = _StuckWriter(w._tb)
  t0 = time.time()
  w.close(tb_timeout_s=0.3)
  assert time.time() - t0 < 5
  assert "did not close within" in capsys.readouterr().err
  assert [r["loss"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [0.5]
  stuck.release.set()  # let the daemon thread finish


def test_close_waits_for_a_writer_that_closes(tmp_path, capsys):
  w = MetricsWriter(tmp_path, show_progress=False)
  w.write(1, {"loss": 0.25}, phase="rl")
  w.close()
  assert "did not close" not in capsys.readouterr().err
  assert list((tmp_path / "tb").iterdir())
