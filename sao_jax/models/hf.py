"""Hugging Face checkpoints (Llama and Qwen2 layouts) in and out of `LlamaLM` parameters.

A checkpoint directory holds `config.json` and either `model.safetensors` or shards named by
`model.safetensors.index.json`. `model_config(dir)` turns config.json into a `ModelConfig`;
`load_params(dir, cfg, mesh=...)` builds every parameter directly on its target
`NamedSharding` with `jax.make_array_from_callback`: each device's block is read from the
file with `safe_open(...).get_slice`, so no process ever holds a whole tensor, let alone the
whole model, unless its devices hold it. Tensors are converted to float32 (the master
copy); bfloat16 files convert exactly. `save(dir, params, cfg)` writes them back, one tensor
in host memory at a time, in shards of at most `max_shard_bytes`.

Layouts (Hugging Face `nn.Linear` stores weight [out, in]; ours are [in, out] with heads
split out):
  embed_tokens.weight [V, D]       -> embed/embedding [V, D]
  {q,k,v}_proj.weight [N*Dh, D]    -> attn/{query,key,value}/kernel [D, N, Dh]
  {q,k,v}_proj.bias [N*Dh]         -> attn/{query,key,value}/bias [N, Dh]   (Qwen2)
  o_proj.weight [D, H*Dh]          -> attn/out/kernel [H, Dh, D]
  {gate,up,down}_proj.weight       -> {gate,up,down}/kernel, transposed
  input_layernorm / post_attention_layernorm / model.norm -> norm_attn / norm_mlp / norm_out
  lm_head.weight [V, D]            -> lm_head/kernel [D, V]   (absent when tied)
Rotary embeddings in these checkpoints already use the "rotate half" pairing LlamaLM uses,
so q/k need no permutation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.sharding import Mesh, SingleDeviceSharding
from safetensors import safe_open
from safetensors.numpy import save_file

from sao_jax import sharding
from sao_jax.config import DEFAULT_RULES, ModelConfig
from sao_jax.models import lora
from sao_jax.models.llama import LlamaLM

SUPPORTED_TYPES = ("llama", "qwen2")
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# ModelConfig fields a caller may set on top of config.json (everything else is the
# checkpoint's architecture and comes from the file).
OVERRIDABLE = (
  "dtype",
  "max_len",
  "memory_slots",
  "memory_dim",
  "value_head",
  "lora_rank",
  "lora_alpha",
  "lora_targets",
)
_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


class CheckpointError(ValueError):
  """A checkpoint is missing, malformed, or describes a model this code does not support."""


# ----------------------------------------------------------------------------- config


def is_checkpoint(path: str | os.PathLike) -> bool:
  """Whether `path` is a Hugging Face checkpoint directory (safetensors weights), as opposed
  to, e.g., one of our own workdirs."""
  path = pathlib.Path(path)
  return (path / SINGLE_FILE).is_file() or (path / INDEX_FILE).is_file()


def read_config(path: str | os.PathLike) -> dict:
  file = pathlib.Path(path) / "config.json"
  if not file.is_file():
    raise CheckpointError(f"{file} not found")
  return json.loads(file.read_text())


def _rope_theta(hf: dict) -> float:
  """rope_theta from either layout: top level (older files) or `rope_parameters`."""
  params = hf.get("rope_parameters") or {}
  scaling = hf.get("rope_scaling") or {}
  for kind in (params.get("rope_type"), scaling.get("rope_type"), scaling.get("type")):
    if kind not in (None, "default"):
      raise CheckpointError(f"rope scaling {kind!r} is not supported (only plain RoPE)")
  theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
  return float(theta)


def model_config(path: str | os.PathLike, **overrides: Any) -> ModelConfig:
  """`ModelConfig(arch="llama", ...)` of the checkpoint at `path` (its config.json).

  `overrides` may set only the fields in OVERRIDABLE (compute dtype, context length, value
  head, memory, LoRA); `max_len` defaults to max_position_embeddings.
  """
  hf = read_config(path)
  bad = sorted(set(overrides) - set(OVERRIDABLE))
  if bad:
    raise CheckpointError(
      f"cannot override {bad}: they come from config.json; overridable: {OVERRIDABLE}"
    )
  kind = hf.get("model_type")
  if kind not in SUPPORTED_TYPES:
    raise CheckpointError(f"model_type {kind!r} not supported; supported: {SUPPORTED_TYPES}")
  if hf.get("hidden_act", "silu") != "silu":
    raise CheckpointError(f"hidden_act {hf['hidden_act']!r} not supported (only silu)")
  if hf.get("mlp_bias"):
    raise CheckpointError("mlp_bias=true is not supported")
  if kind == "llama" and hf.get("attention_bias"):
    raise CheckpointError("Llama attention_bias=true (biases on q/k/v and o) is not supported")
  if kind == "qwen2" and hf.get("use_sliding_window"):
    raise CheckpointError("Qwen2 use_sliding_window=true is not supported")
  width, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
  head_dim = hf.get("head_dim")
  if head_dim is not None and int(head_dim) * heads != width:
    raise CheckpointError(
      f"head_dim {head_dim} * heads {heads} != hidden_size {width}: "
      "only head_dim = hidden_size / heads is supported"
    )
  fields = dict(
    arch="llama",
    vocab_size=int(hf["vocab_size"]),
    width=width,
    depth=int(hf["num_hidden_layers"]),
    heads=heads,
    kv_heads=int(hf.get("num_key_value_heads") or heads),
    mlp_dim=int(hf["intermediate_size"]),
    rope_theta=_rope_theta(hf),
    tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
    qkv_bias=kind == "qwen2",
    norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
    max_len=int(hf.get("max_position_embeddings", 2048)),
  )
  fields.update(overrides)
  return ModelConfig(**fields)


def hf_config(cfg: ModelConfig, base: dict | None = None, dtype: str = "float32") -> dict:
  """config.json for `cfg` (Qwen2 layout when it has q/k/v biases, else Llama), on top of
  `base` (e.g. the imported checkpoint's config.json, which keeps its token ids)."""
  if cfg.arch != "llama":
    raise CheckpointError(f"only arch='llama' models export to Hugging Face, got {cfg.arch!r}")
  kind = "qwen2" if cfg.qkv_bias else "llama"
  out = dict(base or {})
  for stale in ("rope_scaling", "torch_dtype"):
    out.pop(stale, None)
  out.update(
    {
      "architectures": ["Qwen2ForCausalLM" if kind == "qwen2" else "LlamaForCausalLM"],
      "model_type": kind,
      "vocab_size": cfg.vocab_size,
      "hidden_size": cfg.width,
      "intermediate_size": cfg.ffn_dim,
      "num_hidden_layers": cfg.depth,
      "num_attention_heads": cfg.heads,
      "num_key_value_heads": cfg.n_kv_heads,
      "head_dim": cfg.head_dim,
      "hidden_act": "silu",
      "max_position_embeddings": cfg.max_len,
      "rms_norm_eps": cfg.norm_eps,
      "tie_word_embeddings": cfg.tie_embeddings,
      "rope_theta": cfg.rope_theta,
      "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
      "dtype": dtype,
    }
  )
  if kind == "llama":
    out.update(attention_bias=False, mlp_bias=False)
  else:
    out.update(use_sliding_window=False)
  return out


# ----------------------------------------------------------------------------- layouts


@dataclasses.dataclass(frozen=True)
class _Layout:
  """How one of our parameters sits in one Hugging Face tensor.

  `read(src, index)` returns our block `index` (slices of our shape) from the source slice
  object, reading only the rows/columns it needs; `write(arr)` turns our full array into the
  Hugging Face tensor; `src_shape` is the Hugging Face shape expected.
  """

  name: str
  src_shape: tuple[int, ...]
  read: Callable[[Any, tuple[slice, ...]], np.ndarray]
  write: Callable[[np.ndarray], np.ndarray]


def _copy(name, shape):
  return _Layout(name, tuple(shape), lambda src, idx: src[idx], lambda a: a)


def _transposed(name, shape):  # ours [a, b], theirs [b, a]
  a, b = shape
  return _Layout(name, (b, a), lambda src, idx: src[idx[1], idx[0]].T, lambda x: x.T)


def _heads_in(name, d, n, dh):  # ours [D, N, Dh], theirs [N*Dh, D]
  def read(src, idx):
    sd, sn, sdh = idx
    blk = src[sn.start * dh : sn.stop * dh, sd]
    return blk.reshape(sn.stop - sn.start, dh, -1).transpose(2, 0, 1)[:, :, sdh]

  return _Layout(name, (n * dh, d), read, lambda a: a.reshape(d, n * dh).T)


def _heads_out(name, n, dh, d):  # ours [N, Dh, D], theirs [D, N*Dh]
  def read(src, idx):
    sn, sdh, sd = idx
    blk = src[sd, sn.start * dh : sn.stop * dh]
    return blk.reshape(-1, sn.stop - sn.start, dh).transpose(1, 2, 0)[:, sdh, :]

  return _Layout(name, (d, n * dh), read, lambda a: a.reshape(n * dh, d).T)


def _heads_bias(name, n, dh):  # ours [N, Dh], theirs [N*Dh]
  def read(src, idx):
    sn, sdh = idx
    return src[sn.start * dh : sn.stop * dh].reshape(-1, dh)[:, sdh]

  return _Layout(name, (n * dh,), read, lambda a: a.reshape(n * dh))


def layouts(cfg: ModelConfig) -> dict[tuple[str, ...], _Layout]:
  """Our parameter path -> its Hugging Face tensor, for every parameter the format holds."""
  d, h, kv, dh, f, v = (
    cfg.width,
    cfg.heads,
    cfg.n_kv_heads,
    cfg.head_dim,
    cfg.ffn_dim,
    cfg.vocab_size,
  )
  out = {
    ("embed", "embedding"): _copy("model.embed_tokens.weight", (v, d)),
    ("norm_out", "scale"): _copy("model.norm.weight", (d,)),
  }
  if not cfg.tie_embeddings:
    out[("lm_head", "kernel")] = _transposed("lm_head.weight", (d, v))
  for i in range(cfg.depth):
    hf, ours = f"model.layers.{i}.", f"block_{i}"
    out[(ours, "norm_attn", "scale")] = _copy(hf + "input_layernorm.weight", (d,))
    out[(ours, "norm_mlp", "scale")] = _copy(hf + "post_attention_layernorm.weight", (d,))
    for proj, n in (("query", h), ("key", kv), ("value", kv)):
      name = hf + f"self_attn.{proj[0]}_proj."
      out[(ours, "attn", proj, "kernel")] = _heads_in(name + "weight", d, n, dh)
      if cfg.qkv_bias:
        out[(ours, "attn", proj, "bias")] = _heads_bias(name + "bias", n, dh)
    out[(ours, "attn", "out", "kernel")] = _heads_out(hf + "self_attn.o_proj.weight", h, dh, d)
    out[(ours, "gate", "kernel")] = _transposed(hf + "mlp.gate_proj.weight", (d, f))
    out[(ours, "up", "kernel")] = _transposed(hf + "mlp.up_proj.weight", (d, f))
    out[(ours, "down", "kernel")] = _transposed(hf + "mlp.down_proj.weight", (f, d))
  return out


# ----------------------------------------------------------------------------- import


class _Files:
  """The open safetensors files of a checkpoint directory, by tensor name."""

  def __init__(self, path: pathlib.Path, stack: contextlib.ExitStack):
    index = path / INDEX_FILE
    if index.is_file():
      weight_map = json.loads(index.read_text())["weight_map"]
    elif (path / SINGLE_FILE).is_file():
      weight_map = None
    else:
      raise CheckpointError(f"{path} has neither {SINGLE_FILE} nor {INDEX_FILE}")
    files = sorted(set(weight_map.values())) if weight_map else [SINGLE_FILE]
    self._handles = {}
    for name in files:
      if not (path / name).is_file():
        raise CheckpointError(f"{path / name} (named in {INDEX_FILE}) not found")
      self._handles[name] = stack.enter_context(safe_open(path / name, framework="numpy"))
    self._where = weight_map or {k: SINGLE_FILE for k in self._handles[SINGLE_FILE].keys()}

  def names(self) -> set[str]:
    return set(self._where)

  def slice(self, name: str):
    if name not in self._where:
      raise CheckpointError(f"tensor {name!r} not in the checkpoint")
    return self._handles[self._where[name]].get_slice(name)


def _read_block(layout: _Layout, src, index: tuple[slice, ...]) -> np.ndarray:
  """Our block `index` (one device's shard) of one parameter, as float32."""
  return np.ascontiguousarray(layout.read(src, index), dtype=np.float32)


def _normalise(index: tuple, shape: tuple[int, ...]) -> tuple[slice, ...]:
  return tuple(slice(*s.indices(n)[:2]) for s, n in zip(index, shape, strict=True))


def _init_fn(model: LlamaLM) -> Callable:
  cfg = model.cfg

  def init(rng):
    tokens = jnp.zeros((1, 1), jnp.int32)
    mask = jnp.ones((1, 1, 1), bool)
    memory = jnp.zeros((1, 0, cfg.memory_dim or cfg.width)) if cfg.memory_slots else None
    return model.init(rng, tokens, tokens, mask, memory)["params"]

  return init


def _flat(tree) -> dict[tuple[str, ...], Any]:
  return {
    tuple(k.key for k in path): leaf
    for path, leaf in jax.tree_util.tree_flatten_with_path(
      tree, is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata)
    )[0]
  }


def _unflat(flat: dict[tuple[str, ...], Any]) -> dict:
  out: dict = {}
  for path, leaf in flat.items():
    node = out
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = leaf
  return out


def load_params(
  path: str | os.PathLike,
  cfg: ModelConfig,
  *,
  mesh: Mesh | None = None,
  rules: Sequence = DEFAULT_RULES,
  rng: jax.Array | None = None,
) -> dict:
  """Parameters of `LlamaLM(cfg)` from the checkpoint at `path`, placed by `rules` on `mesh`.

  With no mesh, everything goes to the first device. Parameters the format has no place for
  (value head, memory projection, LoRA adapters) are freshly initialised from `rng`, which is
  then required; they are computed on the devices, never on the host.

  Raises CheckpointError on a missing tensor, an unexpected extra tensor, or a shape that
  does not match `cfg`.
  """
  path = pathlib.Path(path)
  if cfg.arch != "llama":
    raise CheckpointError(f"Hugging Face checkpoints load into arch='llama', got {cfg.arch!r}")
  model = LlamaLM(cfg)
  init = _init_fn(model)
  boxed = jax.eval_shape(init, jax.random.key(0))
  if mesh is None:
    shardings = jax.tree.map(lambda _: SingleDeviceSharding(jax.devices()[0]), nn.meta.unbox(boxed))
  else:
    shardings = sharding.logical_shardings(boxed, mesh, rules)
  abstract, shardings = _flat(nn.meta.unbox(boxed)), _flat(shardings)
  maps = layouts(cfg)
  fresh = sorted(set(abstract) - set(maps))
  result: dict[tuple[str, ...], jax.Array] = {}
  with contextlib.ExitStack() as stack:
    files = _Files(path, stack)
    names = {lay.name for lay in maps.values()}
    # A tied checkpoint may still carry lm_head.weight (a copy of the embedding), and older
    # Llama files carry the rotary frequencies as buffers; both are derived, not needed.
    extra = {n for n in files.names() - names if not n.endswith("rotary_emb.inv_freq")}
    extra -= {"lm_head.weight"} if cfg.tie_embeddings else set()
    if extra:
      raise CheckpointError(f"{path}: tensors this model has no place for: {sorted(extra)[:5]}")
    for key, layout in maps.items():
      src = files.slice(layout.name)
      if tuple(src.get_shape()) != layout.src_shape:
        raise CheckpointError(
          f"{layout.name}: shape {tuple(src.get_shape())}, expected "
          f"{layout.src_shape} from the model config"
        )
      shape = abstract[key].shape
      cache: dict[tuple, np.ndarray] = {}  # replicated shards: read once per distinct block

      def block(index, layout=layout, src=src, shape=shape, cache=cache):
        index = _normalise(index, shape)
        k = tuple((s.start, s.stop) for s in index)
        if k not in cache:
          cache[k] = _read_block(layout, src, index)
        return cache[k]

      result[key] = jax.make_array_from_callback(shape, shardings[key], block)
  if fresh:
    if rng is None:
      raise CheckpointError(
        f"parameters not in the checkpoint need an rng to initialise: "
        f"{['/'.join(k) for k in fresh][:5]}"
      )

    # Only the fresh leaves leave the jitted init; XLA drops the rest of it as dead code.
    def pick(r):
      every = _flat(nn.meta.unbox(init(r)))
      return {k: every[k] for k in fresh}

    result.update(jax.jit(pick, out_shardings={k: shardings[k] for k in fresh})(rng))
  return _unflat(result)


def load(
  path: str | os.PathLike,
  *,
  mesh: Mesh | None = None,
  rules: Sequence = DEFAULT_RULES,
  rng: jax.Array | None = None,
  **overrides,
) -> tuple[ModelConfig, dict]:
  """(`model_config(path, **overrides)`, `load_params(...)`) in one call."""
  cfg = model_config(path, **overrides)
  return cfg, load_params(path, cfg, mesh=mesh, rules=rules, rng=rng)


# ----------------------------------------------------------------------------- export


def save(
  path: str | os.PathLike,
  params: dict,
  cfg: ModelConfig,
  *,
  dtype: str = "float32",
  max_shard_bytes: int = 2**30,
  base_config: dict | None = None,
) -> list[str]:
  """Writes config.json and safetensors for `params` into the directory `path`.

  LoRA adapters are merged into their kernels first (`lora.merge`). One tensor at a time is
  gathered to the host and converted to `dtype` (float32, bfloat16 or float16); files hold at
  most `max_shard_bytes` each (one tensor more if a single tensor is larger), with an index
  when there are several. Returns the parameters that were not written because the format
  has no place for them (value head, memory projection).
  """
  if dtype not in _DTYPES:
    raise CheckpointError(f"dtype {dtype!r} not one of {sorted(_DTYPES)}")
  config = hf_config(cfg, base_config, dtype)
  if lora.has_adapters(params):
    params = jax.jit(lora.merge, static_argnums=1)(params, cfg)
  flat = _flat(params)
  maps = layouts(cfg)
  missing = sorted(set(maps) - set(flat))
  if missing:
    raise CheckpointError(f"parameters lack {['/'.join(k) for k in missing][:5]}")
  out = pathlib.Path(path)
  out.mkdir(parents=True, exist_ok=True)
  current: dict[str, np.ndarray] = {}
  size = total = 0
  written: list[tuple[str, list[str]]] = []

  def flush():
    nonlocal current, size
    if current:
      tmp = f".shard-{len(written):05d}.tmp"
      save_file(current, str(out / tmp), metadata={"format": "pt"})
      written.append((tmp, sorted(current)))
    current, size = {}, 0

  for key, layout in maps.items():
    arr = np.asarray(jax.device_get(flat[key]), dtype=np.float32)
    tensor = np.ascontiguousarray(layout.write(arr).astype(_DTYPES[dtype]))
    if current and size + tensor.nbytes > max_shard_bytes:
      flush()
    current[layout.name] = tensor
    size += tensor.nbytes
    total += tensor.nbytes
  flush()
  for stale in [out / SINGLE_FILE, out / INDEX_FILE, *out.glob("model-*-of-*.safetensors")]:
    stale.unlink(missing_ok=True)
  if len(written) == 1:
    os.replace(out / written[0][0], out / SINGLE_FILE)
  else:
    weight_map = {}
    for i, (tmp, names) in enumerate(written):
      final = f"model-{i + 1:05d}-of-{len(written):05d}.safetensors"
      os.replace(out / tmp, out / final)
      weight_map.update({n: final for n in names})
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
  (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
  return ["/".join(k) for k in sorted(set(flat) - set(maps))]
