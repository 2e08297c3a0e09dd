"""Stage 3: INT8 with a per-vector absmax scale; error bound |x - deq(q(x))| <= scale / 2."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax.compression import quant

# Float32 rounding of x / s and of q * s adds at most a few ulps of max|x| to the s/2 bound.
_REL_SLACK = 4 * np.finfo(np.float32).eps


def _check_bound(x):
  q, s = jax.jit(quant.quantize)(x)
  q, s = np.asarray(q), np.asarray(s)
  assert q.dtype == np.int8 and s.dtype == np.float32
  assert q.shape == x.shape and s.shape == x.shape[:-1]
  assert np.all(np.abs(q.astype(np.int32)) <= quant.QMAX)
  xf = np.where(np.isfinite(x), x, 0).astype(np.float32)
  absmax = np.max(np.abs(xf), axis=-1)
  big = absmax >= quant.TINY
  np.testing.assert_allclose(s[big], absmax[big] / 127, rtol=1e-6)
  err = np.abs(xf - np.asarray(quant.dequantize(q, s)))
  bound = s[..., None] / 2 + _REL_SLACK * absmax[..., None]
  assert np.all(err[big] <= bound[big])
  # Vectors below TINY are stored as zeros with scale 0: the error is their own size.
  assert np.all(s[~big] == 0) and np.all(q[~big] == 0)
  assert np.all(err[~big] < quant.TINY)
  return q, s


@pytest.mark.parametrize("shape", [(257, 1), (64, 3, 32), (8, 5, 7, 65)])
def test_error_bound_random_shapes_and_magnitudes(shape):
  """Many vectors per call, each with its own magnitude (1e-35 .. 1e35) and some zeros."""
  rng = np.random.default_rng(sum(shape))
  mag = 10.0 ** rng.uniform(-35, 35, size=shape[:-1] + (1,))
  x = (rng.standard_normal(shape) * mag).astype(np.float32)
  x[rng.random(shape) < 0.1] = 0.0
  _check_bound(x)


def test_zero_tiny_huge_and_mixed_vectors():
  f32 = np.finfo(np.float32)
  x = np.array(
    [
      [0.0, 0.0, 0.0, 0.0],
      [f32.tiny / 8, -f32.tiny / 4, 0.0, f32.tiny / 2],  # subnormals: below TINY
      [f32.max, -f32.max, 1.0, 0.0],
      [1e-20, -3e-20, 2e-20, 0.0],
      [127.0, -127.0, 63.5, -0.5],
      [1.0, 1e-9, -1e-9, 0.0],  # small entries next to a large one round to 0, within s/2
    ],
    np.float32,
  )
  q, s = _check_bound(x)
  assert s[0] == 0 and s[1] == 0
  np.testing.assert_array_equal(q[4], [127, -127, 64, -0])  # 63.5 rounds half to even
  assert q[2, 0] == 127 and q[2, 1] == -127


def test_non_finite_elements_become_zero_and_do_not_set_the_scale():
  x = np.array([[np.nan, 1.0, -2.0], [np.inf, -np.inf, 0.5], [np.nan, np.nan, np.nan]], np.float32)
  q, s = _check_bound(x)
  np.testing.assert_allclose(s, [2 / 127, 0.5 / 127, 0.0], rtol=1e-6)
  assert q[0, 0] == 0 and q[1, 0] == 0 and q[1, 1] == 0 and np.all(q[2] == 0)


def test_idempotent_on_the_grid_and_straight_through_is_bit_exact():
  x = jnp.asarray(np.random.default_rng(0).standard_normal((5, 8)), jnp.float32)
  q, s = quant.quantize(x)
  deq = quant.dequantize(q, s)
  q2, s2 = quant.quantize(deq)
  np.testing.assert_array_equal(np.asarray(q2), np.asarray(q))
  fresh = x * 1.37
  st = quant.straight_through(deq, fresh)
  np.testing.assert_array_equal(np.asarray(st), np.asarray(deq))
  g = jax.grad(lambda f: jnp.sum(quant.straight_through(deq, f) * 3.0))(fresh)
  np.testing.assert_array_equal(np.asarray(g), 3.0)
