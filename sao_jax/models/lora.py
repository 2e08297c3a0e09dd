"""LoRA adapters of the Llama-family model: select, train alone, publish, merge.

With `model.lora_rank = r > 0`, each projection named in `model.lora_targets` holds, next to
its frozen `kernel` W [in..., out...], the adapter pair `lora_a` A [in..., r] and `lora_b`
B [r, out...]; the layer computes x W + (alpha / r) (x A) B (Hu et al. 2021, "LoRA", eq. 3).
B starts at zero, so a fresh adapter changes nothing.

Pure functions over parameter trees (nested dicts, boxed or not):
  `adapter_labels` / `freeze_base`  train only the adapters (optax.multi_transform; the base
                                    gets no update and no optimizer state);
  `adapters` / `with_adapters`      the adapter subtree alone (what a learner would publish to
                                    samplers), and putting it back into a full tree;
  `merge`                           W + (alpha / r) A B, adapters dropped: the plain model
                                    with `lora_rank = 0` (what is exported).
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import optax

from sao_jax.config import ModelConfig

ADAPTER_KEYS = ("lora_a", "lora_b")


def _is_adapter(path) -> bool:
  return any(getattr(k, "key", None) in ADAPTER_KEYS for k in path)


def adapter_labels(params):
  """Same tree as `params` with leaves "adapter" (LoRA A/B) or "frozen" (everything else)."""
  return jax.tree_util.tree_map_with_path(
    lambda path, _: "adapter" if _is_adapter(path) else "frozen", params
  )


def freeze_base(tx: optax.GradientTransformation) -> optax.GradientTransformation:
  """`tx` on the adapters only; every other parameter gets a zero update and no state.

  Gradient clipping inside `tx` then sees the adapters' gradients alone.
  """
  return optax.multi_transform({"adapter": tx, "frozen": optax.set_to_zero()}, adapter_labels)


def adapters(params: Mapping) -> dict:
  """The subtree of LoRA leaves only (same nesting, other leaves and empty branches left out)."""
  out = {}
  for key, value in params.items():
    if key in ADAPTER_KEYS:
      out[key] = value
    elif isinstance(value, Mapping):
      sub = adapters(value)
      if sub:
        out[key] = sub
  return out


def with_adapters(params: Mapping, adapter_tree: Mapping) -> dict:
  """`params` with its adapter leaves replaced by those of `adapter_tree` (which must hold
  exactly the adapter leaves `params` has)."""
  out = {}
  for key, value in params.items():
    if key in ADAPTER_KEYS:
      if key not in adapter_tree:
        raise KeyError(f"adapter tree lacks {key!r}")
      out[key] = adapter_tree[key]
    elif isinstance(value, Mapping):
      out[key] = with_adapters(value, adapter_tree.get(key, {}))
    else:
      out[key] = value
  extra = set(adapter_tree) - set(params)
  if extra:
    raise KeyError(f"adapter tree has entries the parameters lack: {sorted(extra)}")
  return out


def merge(params: Mapping, cfg: ModelConfig) -> dict:
  """Folds every adapter into its kernel: W' = W + (alpha / r) A B, in float32.

  Returns the parameter tree of the same model with `lora_rank = 0` (unboxed params).
  """
  scale = cfg.lora_alpha / cfg.lora_rank if cfg.lora_rank else 0.0
  out = {}
  for key, value in params.items():
    if key in ADAPTER_KEYS:
      continue
    if isinstance(value, Mapping):
      value = merge(value, cfg)
      if "lora_a" in params[key]:
        a, b = params[key]["lora_a"], params[key]["lora_b"]
        delta = jnp.tensordot(a.astype(jnp.float32), b.astype(jnp.float32), axes=1)
        value["kernel"] = (value["kernel"] + scale * delta).astype(value["kernel"].dtype)
    out[key] = value
  return out


def has_adapters(params: Mapping) -> bool:
  return bool(adapters(params))
