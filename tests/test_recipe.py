"""The real-model recipe (experiments/configs/gsm8k_qwen.py) at toy scale: a Qwen2-style
Hugging Face checkpoint (the fixture) post-trained with SAO on problems in GSM8K's published
format, as a user runs it."""

from __future__ import annotations

import json
import math
import subprocess

import jax
import numpy as np
import pytest
from conftest import REPO_ROOT, subprocess_env, train_cmd
from safetensors.numpy import load_file
from test_gsm8k import TEST, TRAIN, _write

from sao_jax import checkpoint as ckpt_lib
from sao_jax import recovery
from sao_jax.config import ConfigError, apply_overrides
from sao_jax.data.gsm8k_tfds import load_tasks
from sao_jax.envs.gsm8k import extract_answer
from sao_jax.learner import make_sft_update
from sao_jax.models import hf, lora
from sao_jax.runners.common import programs_for
from sao_jax.runners.run import restore_init
from sao_jax.setup import load_config, make_setup
from sao_jax.tokenizer import get_tokenizer
from sao_jax.transport import records

RECIPE = REPO_ROOT / "experiments" / "configs" / "gsm8k_qwen.py"
FIXTURE = REPO_ROOT / "tests" / "fixtures" / "hf" / "qwen2_tiny"


def _tiny(tmp_path, *overrides):
  manual = _write(tmp_path / "gsm8k")
  return load_config(
    f"{RECIPE}:tiny",
    overrides=[f"task.options.manual_dir={manual}", f"task.data_dir={tmp_path / 'tfds'}"]
    + list(overrides),
  )


def test_recipe_config_and_its_errors(tmp_path):
  """The tiny variant is the fixture checkpoint's model, tokenizer and weights; a model that
  is not the checkpoint's, or no GSM8K directory, is a clear error."""
  cfg = _tiny(tmp_path)
  assert cfg.init_from == str(FIXTURE) and cfg.model.dtype == "bfloat16"
  assert cfg.tokenizer.startswith("hf:") and cfg.task.family == "gsm8k"
  with pytest.raises(ConfigError, match=r"another model \(model.width=32 \(64\)"):
    load_config(str(RECIPE) + ":tiny", overrides=["model.width=32", "task.options.manual_dir=x"])
  with pytest.raises(ConfigError, match="task.options.manual_dir"):
    load_config(str(RECIPE) + ":tiny")


@pytest.mark.slow
def test_hf_checkpoint_starts_the_run(tmp_path):
  """init_from a Hugging Face directory: its weights are the start; with LoRA only the
  adapters get optimizer state, and the adapters start fresh."""
  cfg = _tiny(tmp_path)
  s = make_setup(cfg)
  assert [t.answer for t in s.train] == ["72", "3000", "1.25"] and len(s.test) == 2
  state = restore_init(s, cfg.init_from)
  _, want = hf.load(FIXTURE)
  for got, ref in zip(jax.tree.leaves(state.params), jax.tree.leaves(want), strict=True):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))

  cfg = apply_overrides(cfg, ["model.lora_rank=2"])
  s = make_setup(cfg)
  progs = programs_for(s, cfg.sft.optim, make_sft_update)
  state = progs.init(jax.random.key(0))
  adapters = sum(x.size for x in jax.tree.leaves(lora.adapters(state.params)))
  assert adapters > 0
  assert sum(x.size for x in jax.tree.leaves(state.opt_state) if x.ndim) == 2 * adapters
  assert set(restore_init(s, cfg.init_from).params["block_0"]["attn"]["query"]) == {
    "kernel",
    "bias",
    "lora_a",
    "lora_b",
  }


def test_recipe_without_a_checkpoint_says_what_to_set(monkeypatch):
  monkeypatch.delenv("SAO_JAX_HF_MODEL", raising=False)
  with pytest.raises(ConfigError, match="set SAO_JAX_HF_MODEL"):
    load_config(str(RECIPE))
  monkeypatch.setenv("SAO_JAX_HF_MODEL", str(FIXTURE))
  cfg = load_config(f"{RECIPE}:lora", overrides=["task.options.manual_dir=x"])
  assert cfg.model.lora_rank == 16 and cfg.model.width == 64 and cfg.rl.algorithm == "sao"


@pytest.mark.slow
def test_tiny_recipe_end_to_end(tmp_path):
  """`sao-jax train` of the tiny variant: SFT then SAO from the fixture checkpoint; every
  trajectory's reward is the answer-extraction reward of its decoded completion; the
  estimates are printed and written."""
  manual = _write(tmp_path / "gsm8k", train=TRAIN, test=TEST)
  workdir = tmp_path / "run"
  cmd = train_cmd(
    f"{RECIPE}:tiny",
    workdir,
    [
      f"task.options.manual_dir={manual}",
      f"task.data_dir={tmp_path / 'tfds'}",
      "recovery.keep_journal=True",
    ],
  )
  proc = subprocess.run(
    cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, env=subprocess_env()
  )
  assert proc.returncode == 0, proc.stdout + proc.stderr
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["sft"]["steps"] == 30 and summary["rl"]["steps"] == 4
  assert summary["rl"]["num_problems"] == 2 and summary["rl"]["nonfinite_skipped"] == 0

  # Rewards: recomputed from each journaled trajectory's completion by answer extraction.
  tok = get_tokenizer(f"hf:{FIXTURE / 'tokenizer.json'}?bos=<|endoftext|>")
  train = load_tasks(manual, "train", data_dir=str(tmp_path / "tfds"))
  rewards = []
  for _, data in recovery.Journal(workdir / "journal", readonly=True).read_from(0):
    rec = records.decode(data)
    text = tok.decode(rec.arrays["tokens"][0][rec.arrays["valid"][0]])
    want = float(extract_answer(text) == train[rec.meta["task_index"]].answer)
    assert rec.meta["reward"] == want, (text, train[rec.meta["task_index"]].answer)
    rewards.append(want)
  assert len(rewards) >= 16 and 1.0 in rewards  # the warm start learnt the answers
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  rl = [r for r in rows if r.get("phase") == "rl"]
  assert len(rl) == 4 and all(0.0 <= r["reward"] <= 1.0 for r in rl)

  # Estimates: printed before training, written with the run, consistent with the model.
  assert "estimates (from the config's shapes, not measured" in proc.stdout
  assert proc.stdout.index("estimates (") < proc.stdout.index('"sft"')
  est = json.loads((workdir / "estimates.json").read_text())
  n = sum(x.size for x in load_file(FIXTURE / hf.SINGLE_FILE).values())
  assert est["params"]["total"] == est["params"]["trainable"] == n
  assert est["shapes"]["kv_slots"] == est["shapes"]["prompt_tokens"] + 80
  lrn = est["learner_bytes_per_device"]
  assert lrn["params"] == 4 * n and lrn["adam"] == 8 * n and lrn["ref_params"] == 0
  assert lrn["total"] == sum(v for k, v in lrn.items() if k != "total") > 0
  assert est["phases"]["rl"]["rows"] == 4 and est["phases"]["sft"]["rows"] == 8

  # The post-trained policy out as a Qwen2 directory: imported back bit for bit, with the
  # checkpoint's config carried over and the tokenizer's specials named.
  out = tmp_path / "export"
  proc = subprocess.run(
    [*cmd[: cmd.index("train")], "export", str(workdir), "--out", str(out)],
    cwd=REPO_ROOT,
    capture_output=True,
    text=True,
    timeout=300,
    env=subprocess_env(),
  )
  assert proc.returncode == 0, proc.stdout + proc.stderr
  config = hf.read_config(out)
  assert config["model_type"] == "qwen2" and config["eos_token_id"] == tok.eos_id
  assert config["bos_token_id"] == tok.bos_id == tok._tok.token_to_id("<|endoftext|>")
  _, exported = hf.load(out)
  cfg = load_config(
    f"{RECIPE}:tiny",
    overrides=[f"task.options.manual_dir={manual}", f"task.data_dir={tmp_path / 'tfds'}"],
  )
  like = programs_for(make_setup(cfg), cfg.sft.optim, make_sft_update).init(jax.random.key(0))
  trained, _, _ = ckpt_lib.restore_params(ckpt_lib.checkpoint_dir(workdir), like.params)
  for got, want in zip(jax.tree.leaves(exported), jax.tree.leaves(trained), strict=True):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  settings = json.loads((out / "tokenizer_config.json").read_text())
  assert settings["bos_token"] == "<|endoftext|>" and (out / "tokenizer.json").is_file()
  assert est["sampler_bytes"]["processes"] == 1 and est["sampler_bytes"]["kv_cache"] > 0
  assert est["device"]["kind"] == "cpu" and "rough" in est["device"]["source"]
  assert math.isfinite(est["train_tokens_per_s_at_peak"]) and est["train_tokens_per_s_at_peak"] > 0
  assert any("not measurements" in a for a in est["assumptions"])
