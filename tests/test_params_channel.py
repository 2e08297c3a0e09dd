import numpy as np
import pytest

from sao_jax.transport.params import ParamPublisher, ParamSubscriber, flatten, unflatten


def _tree(x):
  return {"a": {"w": np.full((2, 3), x, np.float32)}, "b": np.arange(4, dtype=np.int32) + x}


A, B = 0xA, 0xB  # two lineages (sao_jax.lineage ids)


def test_publish_poll_roundtrip_and_rotation(tmp_path):
  pub, sub = ParamPublisher(tmp_path, keep=2), ParamSubscriber(tmp_path)
  assert sub.poll((-1, -1)) is None and sub.announced() is None  # nothing announced yet
  pub.publish(0, _tree(0), lineage=A)
  lineage, version, flat = sub.poll((-1, -1))
  assert (lineage, version) == (A, 0) == sub.announced()
  got = unflatten(_tree(9), flat)
  np.testing.assert_array_equal(got["a"]["w"], np.zeros((2, 3)))
  assert sub.poll((A, 0)) is None  # the one held
  for v in range(1, 5):
    pub.publish(v, _tree(v), lineage=A)
  lineage, version, flat = sub.poll((A, 0))
  assert (lineage, version) == (A, 4) and unflatten(_tree(0), flat)["b"].tolist() == [4, 5, 6, 7]
  files = sorted(p.name for p in tmp_path.glob("params_*.npz"))
  assert files == ["params_00000000000a_v00000003.npz", "params_00000000000a_v00000004.npz"]
  assert not list(tmp_path.glob(".*"))  # no temp files left behind


def test_another_lineage_with_the_same_version_number_is_a_new_policy(tmp_path):
  """A learner resumed from its snapshot at 3 publishes 3 again under a new lineage: a reader
  that holds the lost lineage's 3 (or 4) takes it, and neither file overwrites the other."""
  pub = ParamPublisher(tmp_path, keep=3)
  for v in (3, 4):
    pub.publish(v, _tree(v), lineage=A)
  sub = ParamSubscriber(tmp_path)
  assert sub.poll((-1, -1))[:2] == (A, 4)
  resumed = ParamPublisher(tmp_path, keep=3)  # the restarted learner's
  resumed.publish(3, _tree(30), lineage=B)
  lineage, version, flat = sub.poll((A, 4))
  assert (lineage, version) == (B, 3) and unflatten(_tree(0), flat)["b"][0] == 30
  assert sub.poll((A, 3))[:2] == (B, 3)  # the number alone never matches another lineage
  assert sub.poll((B, 3)) is None
  a3 = np.load(tmp_path / "params_00000000000a_v00000003.npz")
  assert a3["['b']"][0] == 3  # the lost lineage's file is its own, unchanged


def test_unflatten_names_missing_leaves():
  flat = flatten(_tree(1))
  del flat["['b']"]
  with pytest.raises(KeyError, match="lack"):
    unflatten(_tree(0), flat)
