import numpy as np
import pytest

from sao_jax.transport.params import ParamPublisher, ParamSubscriber, flatten, unflatten


def _tree(x):
  return {"a": {"w": np.full((2, 3), x, np.float32)}, "b": np.arange(4, dtype=np.int32) + x}


def test_publish_poll_roundtrip_and_rotation(tmp_path):
  pub, sub = ParamPublisher(tmp_path, keep=2), ParamSubscriber(tmp_path)
  assert sub.poll(-1) is None  # nothing announced yet
  pub.publish(0, _tree(0))
  version, flat = sub.poll(-1)
  assert version == 0
  got = unflatten(_tree(9), flat)
  np.testing.assert_array_equal(got["a"]["w"], np.zeros((2, 3)))
  assert sub.poll(0) is None  # not newer
  for v in range(1, 5):
    pub.publish(v, _tree(v))
  version, flat = sub.poll(0)
  assert version == 4 and unflatten(_tree(0), flat)["b"].tolist() == [4, 5, 6, 7]
  files = sorted(p.name for p in tmp_path.glob("params_v*.npz"))
  assert files == ["params_v00000003.npz", "params_v00000004.npz"]
  assert not list(tmp_path.glob(".*"))  # no temp files left behind


def test_unflatten_names_missing_leaves():
  flat = flatten(_tree(1))
  del flat["['b']"]
  with pytest.raises(KeyError, match="lack"):
    unflatten(_tree(0), flat)
