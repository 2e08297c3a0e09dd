"""Builds the tiny Hugging Face checkpoints and reference outputs under tests/fixtures/hf/.

NOT part of the package or of CI: it needs torch and transformers, which sao_jax never
imports. Run it in a separate virtual environment (the versions it was run with are written
into each reference.json):

  python3.11 -m venv /tmp/hfvenv
  /tmp/hfvenv/bin/pip install torch==2.13.0 transformers==5.24.0 tokenizers==0.23.3 \
      sentencepiece==0.2.3 safetensors==0.8.0 numpy
  /tmp/hfvenv/bin/python scripts/make_hf_fixtures.py            # from the repository root

It also checks an export against transformers (`sao-jax export RUN --out DIR --reference`
first): this code's float32 logits on the export's reference texts within 1e-5 of
transformers' float64 logits of the exported directory, and the exported tokenizer giving the
same ids:

  /tmp/hfvenv/bin/python scripts/make_hf_fixtures.py --check-export DIR [ATOL]

Two checkpoints, each a few hundred KB, with random weights (every tensor perturbed, so that
norm scales and biases matter too):

  qwen2_tiny/  Qwen2ForCausalLM: q/k/v biases, tied embeddings, GQA (4 heads, 2 kv heads),
               rope_theta 1e6, eps 1e-6, weights stored in bfloat16 in one
               model.safetensors; a byte-level BPE tokenizer.json trained here (Qwen-style
               specials, no BOS), model vocabulary padded past the tokenizer's.
  llama_tiny/  LlamaForCausalLM: no biases, untied lm_head, GQA (6 heads, 2 kv heads),
               rope_theta 5e5, eps 1e-5, float32 weights in sharded files with
               model.safetensors.index.json; a SentencePiece tokenizer.model trained here.

For a few prompts each directory gets reference.json (prompt texts, their token ids from the
reference tokenizer, greedy generations from `generate(do_sample=False)`, and the smallest
top-1/top-2 logit gap met while generating, so a test can tell that exact agreement is
meaningful) and reference_logits.npz (float32 logits of the prompts, one array per prompt),
all computed in float32 with eager attention.
"""

from __future__ import annotations

import io
import json
import pathlib
import shutil
import sys

import numpy as np
import sentencepiece as spm
import tokenizers
import torch
import transformers
from tokenizers import decoders, models, pre_tokenizers, trainers

ROOT = pathlib.Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "hf"
MAX_NEW_TOKENS = 12

CORPUS = [
  "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips "
  "in May. How many clips did Natalia sell altogether in April and May?",
  "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of "
  "babysitting. How much did she earn?",
  "Betty is saving money for a new wallet which costs $100. Betty has only half of the money "
  "she needs. Her parents decided to give her $15 for that purpose.",
  "James writes a 3-page letter to 2 different friends twice a week. How many pages does "
  "he write a year?",
  "Ann had 7 eggs, got 5, sold 3. How many eggs does she have now? The answer is 9.",
  "Natalia sold 48/2 = 24 clips in May. Natalia sold 48+24 = 72 clips altogether.",
  "Question: Tom has 12 keys and loses 3. How many keys are left?\nAnswer: 12 - 3 = 9",
]
PROMPTS = [
  "Question: Natalia sold 48 clips. How many clips?\nAnswer:",
  "Weng earns $12 an hour",
  "Ann had 7 eggs",
]


def _perturb(model: torch.nn.Module, seed: int):
  """Random values in every tensor: weights N(0, 0.15^2); norm scales 1 + N(0, 0.1^2);
  biases N(0, 0.1^2). Library init leaves norms at 1 and biases at 0, which would hide a
  wrong mapping of those tensors."""
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      noise = torch.randn(p.shape, generator=gen)
      if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.1 * noise)
      elif name.endswith(".bias"):
        p.copy_(0.1 * noise)
      else:
        p.copy_(0.15 * noise)


def _bpe_tokenizer() -> tokenizers.Tokenizer:
  """Byte-level BPE (GPT-2/Qwen style) with Qwen's special tokens."""
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=300,
    special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
  )
  tok.train_from_iterator(CORPUS, trainer)
  return tok


def _spm_model(path: pathlib.Path):
  """Llama-style SentencePiece BPE: unk 0, bos 1, eos 2, no pad, byte fallback, no
  normalisation (which also keeps the file small: no normaliser table)."""
  buf = io.BytesIO()
  spm.SentencePieceTrainer.train(
    sentence_iterator=iter(CORPUS * 4),
    model_writer=buf,
    model_type="bpe",
    vocab_size=352,
    byte_fallback=True,
    character_coverage=1.0,
    num_threads=1,
    unk_id=0,
    bos_id=1,
    eos_id=2,
    pad_id=-1,
    split_digits=True,
    normalization_rule_name="identity",
    remove_extra_whitespaces=False,
    minloglevel=2,
  )
  path.write_bytes(buf.getvalue())


def _references(
  model,
  prompts: list[str],
  ids: list[list[int]],
  eos_id: int,
  pad_id: int,
  out_dir: pathlib.Path,
  extra: dict,
):
  model.eval()
  logits, generations, margins = {}, [], []
  with torch.no_grad():
    for i, row in enumerate(ids):
      x = torch.tensor([row])
      logits[f"prompt_{i}"] = model(x).logits[0].float().numpy()
      out = model.generate(
        x,
        attention_mask=torch.ones_like(x),
        max_new_tokens=MAX_NEW_TOKENS,
        do_sample=False,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        output_scores=True,
        return_dict_in_generate=True,
      )
      generations.append(out.sequences[0, len(row) :].tolist())
      for scores in out.scores:
        top2 = torch.topk(scores[0].float(), 2).values
        margins.append(float(top2[0] - top2[1]))
  np.savez(out_dir / "reference_logits.npz", **logits)
  ref = {
    "prompts": prompts,
    "input_ids": ids,
    "greedy": generations,
    "max_new_tokens": MAX_NEW_TOKENS,
    "eos_id": eos_id,
    "pad_id": pad_id,
    "min_greedy_margin": min(margins),
    "made_with": {
      "torch": torch.__version__,
      "transformers": transformers.__version__,
      "tokenizers": tokenizers.__version__,
      "sentencepiece": spm.__version__,
      "python": sys.version.split()[0],
      "command": "python scripts/make_hf_fixtures.py",
    },
    **extra,
  }
  (out_dir / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")


def make_qwen2(out_dir: pathlib.Path):
  bpe = _bpe_tokenizer()
  fast = transformers.PreTrainedTokenizerFast(
    tokenizer_object=bpe, eos_token="<|endoftext|>", pad_token="<|endoftext|>"
  )
  fast.save_pretrained(out_dir)
  tok_vocab = bpe.get_vocab_size()
  cfg = transformers.Qwen2Config(
    vocab_size=-(-(tok_vocab + 1) // 64) * 64,
    hidden_size=64,
    intermediate_size=144,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    use_sliding_window=False,
    bos_token_id=None,
    eos_token_id=fast.eos_token_id,
    pad_token_id=fast.pad_token_id,
    attn_implementation="eager",
  )
  torch.manual_seed(0)
  model = transformers.Qwen2ForCausalLM(cfg)
  _perturb(model, seed=1)
  model.to(torch.bfloat16).save_pretrained(out_dir)
  model = transformers.Qwen2ForCausalLM.from_pretrained(
    out_dir, dtype=torch.float32, attn_implementation="eager"
  )
  reloaded = transformers.AutoTokenizer.from_pretrained(out_dir)
  ids = [reloaded(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
  _references(
    model,
    PROMPTS,
    ids,
    fast.eos_token_id,
    fast.pad_token_id,
    out_dir,
    {"tokenizer_vocab_size": tok_vocab, "decoded": [reloaded.decode(r) for r in ids]},
  )


def make_llama(out_dir: pathlib.Path):
  _spm_model(out_dir / "tokenizer.model")
  sp = spm.SentencePieceProcessor(model_file=str(out_dir / "tokenizer.model"))
  cfg = transformers.LlamaConfig(
    vocab_size=sp.get_piece_size(),
    hidden_size=48,
    intermediate_size=112,
    num_hidden_layers=2,
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=512,
    rope_parameters={"rope_type": "default", "rope_theta": 5e5},
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    attention_bias=False,
    mlp_bias=False,
    bos_token_id=sp.bos_id(),
    eos_token_id=sp.eos_id(),
    pad_token_id=None,
    attn_implementation="eager",
  )
  torch.manual_seed(0)
  model = transformers.LlamaForCausalLM(cfg)
  _perturb(model, seed=2)
  model.save_pretrained(out_dir, max_shard_size="100KB")
  model = transformers.LlamaForCausalLM.from_pretrained(
    out_dir, dtype=torch.float32, attn_implementation="eager"
  )
  ids = [[sp.bos_id()] + sp.encode(p) for p in PROMPTS]
  _references(
    model,
    PROMPTS,
    ids,
    sp.eos_id(),
    sp.eos_id(),
    out_dir,
    {"decoded": [sp.decode(r[1:]) for r in ids]},
  )


def check_export(path: pathlib.Path, atol: float) -> dict:
  """`sao-jax export RUN --out PATH --reference` wrote this code's float32 logits on a few
  texts (sao_jax_reference.npz). Loads PATH with transformers (eager attention) in float64,
  the exact answer up to rounding, and in float32, and compares: the export passes when this
  code's float32 logits lie within `atol` of transformers' float64 ones. (Two float32
  implementations differ by their two rounding errors: on the Qwen2 fixture run transformers'
  own float32 logits are 8e-6 from its float64 ones, this code's 7e-6, and the two float32
  results 1.4e-5 apart; all three numbers are reported.) Also checks that the exported
  tokenizer loads in transformers and gives the same ids. Writes PATH/transformers_check.json;
  exit status 1 when it does not pass."""
  ref = np.load(path / "sao_jax_reference.npz")
  report = json.loads((path / "export.json").read_text())
  models = {
    name: transformers.AutoModelForCausalLM.from_pretrained(
      path, dtype=dtype, attn_implementation="eager"
    ).eval()
    for name, dtype in (("float32", torch.float32), ("float64", torch.float64))
  }
  tok = transformers.AutoTokenizer.from_pretrained(path)
  errs: dict[str, list[float]] = {"vs_float64": [], "vs_float32": [], "float32_vs_float64": []}
  same_ids = []
  with torch.no_grad():
    for i, text in enumerate(report["reference"]["texts"]):
      n = int(ref["lengths"][i])
      ids = ref["input_ids"][i, :n].tolist()
      same_ids.append(tok.encode(text, add_special_tokens=False) == ids[1:])
      got = {k: m(torch.tensor([ids])).logits[0].double().numpy() for k, m in models.items()}
      ours = ref["logits"][i, :n].astype(np.float64)
      errs["vs_float64"].append(float(np.abs(ours - got["float64"]).max()))
      errs["vs_float32"].append(float(np.abs(ours - got["float32"]).max()))
      errs["float32_vs_float64"].append(float(np.abs(got["float32"] - got["float64"]).max()))
  worst = {k: max(v) for k, v in errs.items()}
  out = {
    "export": str(path),
    "model_type": report.get("model_type"),
    "max_abs_logit_error": {
      "ours_f32_vs_transformers_f64": worst["vs_float64"],
      "ours_f32_vs_transformers_f32": worst["vs_float32"],
      "transformers_f32_vs_its_f64": worst["float32_vs_float64"],
    },
    "per_text": errs,
    "logit_scale": float(np.abs(ref["logits"]).max()),
    "tokenizer_same_ids": same_ids,
    "atol": atol,
    "ok": worst["vs_float64"] <= atol and all(same_ids),
    "made_with": {"torch": torch.__version__, "transformers": transformers.__version__},
    "command": " ".join(["python", *sys.argv]),
  }
  (path / "transformers_check.json").write_text(json.dumps(out, indent=2) + "\n")
  return out


def main():
  if len(sys.argv) > 1 and sys.argv[1] == "--check-export":
    if len(sys.argv) < 3:
      raise SystemExit("usage: make_hf_fixtures.py --check-export EXPORT_DIR [ATOL=1e-5]")
    out = check_export(pathlib.Path(sys.argv[2]), float(sys.argv[3]) if len(sys.argv) > 3 else 1e-5)
    print(json.dumps(out, indent=2))
    raise SystemExit(0 if out["ok"] else 1)
  for name, make in (("qwen2_tiny", make_qwen2), ("llama_tiny", make_llama)):
    out_dir = ROOT / name
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    make(out_dir)
    size = sum(f.stat().st_size for f in out_dir.iterdir())
    print(f"{out_dir}: {size / 1024:.0f} KB, files: {sorted(f.name for f in out_dir.iterdir())}")


if __name__ == "__main__":
  main()
