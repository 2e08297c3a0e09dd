"""`sao-jax export WORKDIR --out DIR`: a run's policy as a directory other tools load.

What is written depends on the model's architecture:

  * arch="llama" (Llama- and Qwen2-style policies, e.g. one post-trained from a Hugging Face
    checkpoint): a Hugging Face directory, `config.json` (Qwen2 layout when the model has
    q/k/v biases, else Llama), the weights as safetensors (`models.hf.save`: LoRA adapters
    merged into their kernels, shards with an index past `max_shard_bytes`),
    `generation_config.json` and the tokenizer files (`tokenizer.save_for_hf`). It loads in
    transformers (`AutoModelForCausalLM.from_pretrained(DIR)`) and vLLM, and back into this
    code (`init_from=DIR`). A value head or memory projection has no place in that format and
    is left out (named in export.json).
  * arch="gpt" (the character-level default): no transformers class has its layout (learned
    absolute positions, RMSNorm, a GELU MLP without biases, tied embeddings), so it is not a
    Hugging Face model. The directory holds its weights as safetensors under this code's own
    parameter names ("block_0/attn/query/kernel"), `sao_jax_model.json` (its ModelConfig), and
    the tokenizer files; a model with arch="llama" exports to transformers instead.

Either way `export.json` records the source (workdir, snapshot step, config name), what was
and was not written, and with `reference` the inputs and float32 logits of this code's model
on a few fixed texts (`sao_jax_reference.npz`), which scripts/make_hf_fixtures.py
--check-export compares with transformers' logits of the exported directory.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil
from typing import Any

import jax
import numpy as np
from flax import linen as nn
from safetensors.numpy import save_file

from sao_jax import checkpoint as ckpt_lib
from sao_jax import config as config_lib
from sao_jax.models import hf, make_model
from sao_jax.policy import param_shapes
from sao_jax.tokenizer import get_tokenizer, save_for_hf

REFERENCE_FILE = "sao_jax_reference.npz"
# Texts every tokenizer here can encode (the character tokenizer takes printable ASCII only).
REFERENCE_TEXTS = ("12+34=46", "Question: 7*8-5? Answer: 51", "The answer is 42.")
MARKER = "export.json"


def _abstract_params(model) -> dict:
  """Shapes and dtypes of `model`'s parameters, on the first device (what the snapshot is
  restored onto: an export gathers everything into one process anyway)."""
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
    nn.meta.unbox(param_shapes(model)),
  )


def _reference(model, params, tok) -> dict[str, np.ndarray]:
  """Float32 logits of `model` on REFERENCE_TEXTS (BOS first), right-padded into one batch."""
  from sao_jax.sampling import sequence_logits

  rows = [tok.encode(t, add_bos=True) for t in REFERENCE_TEXTS]
  length = max(len(r) for r in rows)
  ids = np.full((len(rows), length), tok.pad_id, np.int32)
  valid = np.zeros((len(rows), length), bool)
  for i, r in enumerate(rows):
    ids[i, : len(r)], valid[i, : len(r)] = r, True
  fp32 = make_model(dataclasses.replace(model.cfg, dtype="float32"))
  logits = np.asarray(jax.jit(lambda p, t, v: sequence_logits(fp32, p, t, v))(params, ids, valid))
  return {"input_ids": ids, "lengths": valid.sum(1).astype(np.int32), "logits": logits}


def _check_out(out: pathlib.Path) -> None:
  """`out` must be new, empty, or an earlier export (which is replaced)."""
  if out.exists() and not out.is_dir():
    raise FileExistsError(f"{out} exists and is not a directory")
  if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
    raise FileExistsError(
      f"{out} is not empty and holds no {MARKER} (not an earlier export): choose a new --out"
    )
  if out.is_dir():
    shutil.rmtree(out)


def export_workdir(
  workdir: str | pathlib.Path,
  out: str | pathlib.Path,
  *,
  step: int | None = None,
  dtype: str = "float32",
  max_shard_bytes: int = 2**30,
  reference: bool = False,
) -> dict[str, Any]:
  """Writes the policy of `workdir`'s latest snapshot (or `step`'s) into `out`; returns the
  report also written as out/export.json. See the module docstring for what is written."""
  directory = ckpt_lib.checkpoint_dir(pathlib.Path(workdir))
  if dtype not in ("float32", "bfloat16", "float16"):
    raise config_lib.ConfigError(f"dtype {dtype!r}: one of float32, bfloat16, float16")
  built: dict[str, Any] = {}

  def like_for(meta: dict):
    cfg = config_lib.from_saved(meta["config"])
    if cfg.compression.enabled:
      raise config_lib.ConfigError(
        "compression.enabled: the compressed-memory policy (encoder, LSTM filter, memory "
        "prefix) has no exported form; export a run without compression"
      )
    tok = get_tokenizer(cfg.tokenizer)
    model = make_model(
      dataclasses.replace(cfg.model, vocab_size=cfg.model.vocab_size or tok.vocab_size)
    )
    built.update(cfg=cfg, tok=tok, model=model)
    return _abstract_params(model)

  # The newest readable snapshot (a damaged one is skipped), or exactly `step`'s.
  params, step, _, skipped = ckpt_lib.restore_params_readable(directory, like_for, step)
  cfg, tok, model = built["cfg"], built["tok"], built["model"]
  out = pathlib.Path(out)
  _check_out(out)
  out.mkdir(parents=True)
  files = save_for_hf(cfg.tokenizer, out)
  specials = {"bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id, "pad_token_id": tok.pad_id}
  report: dict[str, Any] = {
    "source": {
      "workdir": str(workdir),
      "checkpoint": str(directory),
      "step": step,
      "skipped_damaged": skipped,
    },
    "config": cfg.name,
    "arch": model.cfg.arch,
    "tokenizer": cfg.tokenizer,
    "dtype": dtype,
  }
  if model.cfg.arch == "llama":
    base = (
      hf.read_config(cfg.init_from) if cfg.init_from and hf.is_checkpoint(cfg.init_from) else {}
    )
    try:
      left_out = hf.save(
        out,
        params,
        model.cfg,
        dtype=dtype,
        max_shard_bytes=max_shard_bytes,
        base_config={**base, **specials},
      )
    except hf.CheckpointError as err:
      raise config_lib.ConfigError(f"export of {workdir}: {err}") from None
    (out / "generation_config.json").write_text(json.dumps(specials, indent=2) + "\n")
    written = sorted(p.name for p in out.glob("*.safetensors*")) + ["config.json"]
    report.update(
      format="huggingface",
      model_type=hf.read_config(out)["model_type"],
      loads_in="transformers AutoModelForCausalLM, vLLM, and sao_jax (init_from=DIR)",
      files=[*written, "generation_config.json", *files],
      not_exported=left_out,
    )
  else:
    flat = {
      "/".join(str(k.key) for k in path): np.asarray(jax.device_get(leaf), np.float32)
      for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
    }
    np_dtype = hf._DTYPES[dtype]
    save_file(
      {k: np.ascontiguousarray(v.astype(np_dtype)) for k, v in flat.items()},
      str(out / "model.safetensors"),
      metadata={"format": "sao_jax"},
    )
    (out / "sao_jax_model.json").write_text(
      json.dumps(dataclasses.asdict(model.cfg), indent=2, sort_keys=True) + "\n"
    )
    report.update(
      format="sao_jax",
      loads_in="safetensors (this code's parameter names) with sao_jax_model.json",
      files=["model.safetensors", "sao_jax_model.json", *files],
      not_exported=[
        f"a transformers model: arch {model.cfg.arch!r} (learned positions, RMSNorm, "
        "bias-free GELU MLP, tied embeddings) has no transformers class; train with "
        "model.arch='llama' for a Hugging Face export"
      ],
    )
  if reference:
    np.savez(out / REFERENCE_FILE, **_reference(model, params, tok))
    report["reference"] = {"file": REFERENCE_FILE, "texts": list(REFERENCE_TEXTS)}
  (out / MARKER).write_text(json.dumps(report, indent=2) + "\n")
  return report
