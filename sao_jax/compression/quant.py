"""Stage 3: in-graph INT8 quantisation with a dynamic range per vector.

Each vector x (last axis) gets its own scale s = max|x| / 127 and is stored as
q = round(x / s) in [-127, 127] (symmetric, so -128 is never used and 0 is exact). Since
|x/s - q| <= 1/2, the dequantised x_hat = q * s satisfies |x - x_hat| <= s / 2 per element
(up to float32 rounding of the division and product, ~1e-7 relative).

Edge cases, by design:
* a vector whose absmax is below `TINY` (zero or subnormal) stores s = 0, q = 0: its error is
  its own magnitude (< TINY), not s/2 — dividing by a subnormal scale overflows;
* non-finite elements (NaN, +-Inf) are stored as 0 and do not enter the scale, so one bad
  element cannot wipe out the other elements of its vector; callers that care detect them
  upstream (the sampler's memory comes from a LayerNorm'd encoder and is always finite).

Pure jnp; jitted by the caller (the sampler's compression step).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

QMAX = 127
TINY = 1e-30


def quantize(x_d: jax.Array) -> tuple[jax.Array, jax.Array]:
  """x [..., d] float -> (q [..., d] int8, scale [...] float32), per-vector absmax scale."""
  x = x_d.astype(jnp.float32)
  x = jnp.where(jnp.isfinite(x), x, 0.0)
  absmax = jnp.max(jnp.abs(x), axis=-1)
  scale = jnp.where(absmax >= TINY, absmax / QMAX, 0.0)
  safe = jnp.where(scale > 0, scale, 1.0)
  q = jnp.clip(jnp.round(x / safe[..., None]), -QMAX, QMAX)
  q = jnp.where(scale[..., None] > 0, q, 0.0)
  return q.astype(jnp.int8), scale


def dequantize(q_d: jax.Array, scale_e: jax.Array) -> jax.Array:
  """Inverse of `quantize` up to the rounding error: q * scale, float32."""
  return q_d.astype(jnp.float32) * scale_e[..., None].astype(jnp.float32)


def straight_through(stored_d: jax.Array, fresh_d: jax.Array) -> jax.Array:
  """Value of `stored` (bit-exact), gradient of `fresh`.

  The learner conditions on exactly the memory the sampler stored (dequantised INT8), while
  the encoder that produced it gets the gradient as if its fresh output had been used (the
  straight-through estimator). `fresh - stop_gradient(fresh)` is exactly 0 for finite values,
  so the sum equals `stored` bit for bit.
  """
  return stored_d + (fresh_d - jax.lax.stop_gradient(fresh_d))
