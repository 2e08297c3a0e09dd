"""Silent damage to stored arrays: 16 flipped bytes inside a compressed array file restore
without an error from Orbax, so snapshots, shadow snapshots and published parameter files
carry content checksums, checked on every restore; a damaged one is set aside and the
previous one used."""

import pathlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_recovery import _sao_programs

from sao_jax import checkpoint as ckpt
from sao_jax.config import Config, ModelConfig
from sao_jax.transport.params import ParamPublisher, ParamSubscriber, unflatten


def _flip(path: pathlib.Path, at: float = 0.3, n: int = 16) -> None:
  data = bytearray(path.read_bytes())
  start = int(len(data) * at)
  data[start : start + n] = bytes(b ^ 0xFF for b in data[start : start + n])
  path.write_bytes(bytes(data))


def _largest_array_file(step_dir: pathlib.Path) -> pathlib.Path:
  """The biggest chunk file of the params item: where the weights' bytes are."""
  files = [f for f in (step_dir / "params").rglob("*") if f.is_file() and f.parent.name == "d"]
  return max(files, key=lambda f: f.stat().st_size)


def test_flipped_bytes_in_the_newest_snapshot_fall_back_to_the_older(tmp_path, monkeypatch):
  progs = _sao_programs()
  state = progs.init(jax.random.key(0))
  mngr = ckpt.manager(tmp_path / "ck", every=1, keep=3)
  cfg = Config(model=ModelConfig(vocab_size=16, width=16, depth=1, heads=2, max_len=16))
  saved = {}
  for step in (1, 2):
    state = state.replace(
      step=jnp.asarray(step, state.step.dtype),
      params=jax.tree.map(lambda x: x + 0.01, state.params),
    )
    saved[step] = jax.device_get(state.params)
    ckpt.save(mngr, state, cfg, {"stream": {"n": int(state.step)}})
  mngr.wait_until_finished()
  _flip(_largest_array_file(tmp_path / "ck" / "2"))
  like = progs.init(jax.random.key(1))
  # Orbax alone restores the damaged snapshot without complaint, to other values.
  with monkeypatch.context() as m:
    m.setattr(ckpt, "verify", lambda *a: None)
    damaged, _ = ckpt.restore_state(ckpt.manager(tmp_path / "ck", every=1), like, 2)
  assert not all(
    np.array_equal(a, b)
    for a, b in zip(
      jax.tree.leaves(jax.device_get(damaged.params)), jax.tree.leaves(saved[2]), strict=True
    )
  )
  mngr2 = ckpt.manager(tmp_path / "ck", every=1, keep=3)
  with pytest.warns(RuntimeWarning, match="snapshot step 2 .*DamagedSnapshot.*differ"):
    restored, meta, step, skipped = ckpt.restore_latest_valid(mngr2, like)
  assert step == 1 and skipped == [2] and meta["stream"]["n"] == 1
  assert mngr2.all_steps() == [1] and list((tmp_path / "ck-corrupt").iterdir())
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored.params), saved[1])
  with pytest.raises(ckpt.DamagedSnapshot, match="params"):  # evaluation's path checks too
    ckpt.verify(damaged.params, ckpt.checksums(saved[2]), "params")


def test_a_damaged_best_shadow_falls_back_to_the_next_best(tmp_path):
  rng = np.random.default_rng(0)
  params = {"w": rng.normal(size=(64, 64)).astype(np.float32), "b": np.zeros(64, np.float32)}
  bank = ckpt.ShadowBank(tmp_path / "shadows", keep=3)
  for step, acc in [(0, 0.3), (10, 0.6), (20, 0.5)]:
    bank.save(step, jax.tree.map(lambda x, s=step: x + s, params), acc)
  _flip(_largest_array_file(tmp_path / "shadows" / "10"))
  with pytest.warns(RuntimeWarning, match="shadow step 10 .*DamagedSnapshot"):
    step, acc, back = bank.restore_best(params)
  assert (step, acc) == (20, 0.5) and bank.best() == (20, 0.5)
  assert sorted(bank.mngr.all_steps()) == [0, 20]
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b) + 20), back, params
  )
  bank.close()


def _tree(x):
  return {"w": np.arange(4096, dtype=np.float32) + x}


def test_a_damaged_published_parameter_file_is_skipped_for_the_newest_intact(tmp_path):
  pub, sub = ParamPublisher(tmp_path, keep=3), ParamSubscriber(tmp_path)
  for v in (1, 2):
    pub.publish(v, _tree(v))
  _flip(tmp_path / "params_v00000002.npz", at=0.5)
  with pytest.warns(RuntimeWarning, match="params_v00000002.npz are damaged"):
    version, flat = sub.poll(-1)
  assert version == 1 and unflatten(_tree(0), flat)["w"][0] == 1
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # reported once, not on every poll
    assert sub.poll(1) is None
  pub.publish(3, _tree(3))  # the next intact version is taken as usual
  assert sub.poll(1)[0] == 3
  (tmp_path / "params_v00000003.npz").write_bytes(b"PK\x03\x04 truncated")
  with pytest.warns(RuntimeWarning, match="damaged"):
    assert ParamSubscriber(tmp_path).poll(-1)[0] == 1
