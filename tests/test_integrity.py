"""Silent damage to stored arrays: 16 flipped bytes inside a compressed array file can restore
without an error from Orbax (where they land in a compressed block's literals rather than in a
frame header, which zstd does detect), so snapshots, shadow snapshots and published parameter files
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


def _flip_silently(step_dir: pathlib.Path, restores_other_values) -> None:
  """Flips 16 bytes of an array data file where Orbax restores them without an error.

  Which OCDBT data file holds the weights and which the b-tree nodes (checked, so damage
  there is reported) varies from run to run, as do the offsets inside it (writes are
  asynchronous); the damage this suite is about is the kind Orbax does not detect. Tries the
  data files, largest first, at a few offsets each until `restores_other_values()` (an Orbax
  restore with our checksums off) returns True; every try is in the message if none does.
  """
  files = [f for f in (step_dir / "params").rglob("*") if f.is_file() and f.parent.name == "d"]
  tried = []
  for path in sorted(files, key=lambda f: f.stat().st_size, reverse=True):
    original = path.read_bytes()
    for at in (0.3, 0.5, 0.7):
      _flip(path, at=at)
      try:
        if restores_other_values():
          return
        tried.append((path.name[:8], at, "restored the saved values"))
      except Exception as err:  # noqa: BLE001 - Orbax detected this one; try another place
        tried.append((path.name[:8], at, f"{type(err).__name__}: {str(err)[:120]}"))
      path.write_bytes(original)
  raise AssertionError(f"no place in {step_dir} gave silent damage: {tried}")


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
  like = progs.init(jax.random.key(1))
  damaged = {}

  def orbax_alone_restores_other_values() -> bool:
    with monkeypatch.context() as m:
      m.setattr(ckpt, "verify", lambda *a: None)
      damaged["state"], _ = ckpt.restore_state(ckpt.manager(tmp_path / "ck", every=1), like, 2)
    return not all(
      np.array_equal(a, b)
      for a, b in zip(
        jax.tree.leaves(jax.device_get(damaged["state"].params)),
        jax.tree.leaves(saved[2]),
        strict=True,
      )
    )

  # Orbax alone restores the damaged snapshot without complaint, to other values.
  _flip_silently(tmp_path / "ck" / "2", orbax_alone_restores_other_values)
  damaged = damaged["state"]
  mngr2 = ckpt.manager(tmp_path / "ck", every=1, keep=3)
  with pytest.warns(RuntimeWarning, match="snapshot step 2 .*DamagedSnapshot.*differ"):
    restored, meta, step, skipped = ckpt.restore_latest_valid(mngr2, like)
  assert step == 1 and skipped == [2] and meta["stream"]["n"] == 1
  assert mngr2.all_steps() == [1] and list((tmp_path / "ck-corrupt").iterdir())
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored.params), saved[1])
  with pytest.raises(ckpt.DamagedSnapshot, match="params"):  # evaluation's path checks too
    ckpt.verify(damaged.params, ckpt.checksums(saved[2]), "params")


def test_a_damaged_best_shadow_falls_back_to_the_next_best(tmp_path, monkeypatch):
  rng = np.random.default_rng(0)
  params = {"w": rng.normal(size=(64, 64)).astype(np.float32), "b": np.zeros(64, np.float32)}
  bank = ckpt.ShadowBank(tmp_path / "shadows", keep=3)
  for step, acc in [(0, 0.3), (10, 0.6), (20, 0.5)]:
    bank.save(step, jax.tree.map(lambda x, s=step: x + s, params), acc)

  def orbax_alone_restores_other_values() -> bool:
    with monkeypatch.context() as m:
      m.setattr(ckpt, "verify", lambda *a: None)
      reader = ckpt.ShadowBank(tmp_path / "shadows", keep=3)
      try:
        back = reader.restore(10, params)
      finally:
        reader.close()
    return not np.array_equal(np.asarray(back["w"]), params["w"] + 10)

  _flip_silently(tmp_path / "shadows" / "10", orbax_alone_restores_other_values)
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
    pub.publish(v, _tree(v), lineage=7)
  _flip(tmp_path / "params_000000000007_v00000002.npz", at=0.5)
  with pytest.warns(RuntimeWarning, match="params_000000000007_v00000002.npz are damaged"):
    lineage, version, flat = sub.poll((-1, -1))
  assert (lineage, version) == (7, 1) and unflatten(_tree(0), flat)["w"][0] == 1
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # reported once, not on every poll
    assert sub.poll((7, 1)) is None
  pub.publish(3, _tree(3), lineage=7)  # the next intact version is taken as usual
  assert sub.poll((7, 1))[:2] == (7, 3)
  (tmp_path / "params_000000000007_v00000003.npz").write_bytes(b"PK\x03\x04 truncated")
  with pytest.warns(RuntimeWarning, match="damaged"):
    assert ParamSubscriber(tmp_path).poll((-1, -1))[1] == 1
