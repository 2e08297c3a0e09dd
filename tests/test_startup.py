"""Start-up marks and the persistent compilation cache's directory."""

import pathlib

import pytest

import sao_jax
from sao_jax import startup


def test_breakdown_is_durations_between_marks_in_order(monkeypatch):
  monkeypatch.setattr(startup, "MARKS", {"a": 1.0, "c": 4.5, "b": 3.0})
  assert startup.breakdown(["a", "b", "missing", "c"]) == {"a": 1.0, "b": 2.0, "c": 1.5}
  first = startup.mark("a")  # recorded once: the first time a stage finished
  assert first == 1.0 and startup.MARKS["a"] == 1.0
  # A stage that ended before it is marked (the first update, before its ledger write) is
  # marked at its end, so the stages add up to the time measured to that end.
  end = sao_jax.PROCESS_T0 + 7.25
  assert startup.mark("d", at=end) == pytest.approx(7.25)
  assert startup.breakdown(["a", "b", "c", "d"])["d"] == pytest.approx(7.25 - 4.5)


def test_cache_dir_settings(monkeypatch, tmp_path):
  monkeypatch.setenv("SAO_JAX_CACHE", str(tmp_path / "c"))
  assert startup.cache_dir("user") == tmp_path / "c"
  monkeypatch.delenv("SAO_JAX_CACHE")
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert startup.cache_dir("user") == tmp_path / "xdg" / "sao_jax" / "xla"
  assert startup.cache_dir("workdir", tmp_path / "w") == tmp_path / "w" / "xla_cache"
  assert startup.cache_dir("off") is None
  assert startup.cache_dir(str(tmp_path / "d")) == pathlib.Path(tmp_path / "d")
  with pytest.raises(ValueError, match="needs a workdir"):
    startup.cache_dir("workdir")
