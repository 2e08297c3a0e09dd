"""`sao-jax export`: a run's snapshot out as a directory other tools load, and back.

A Llama-style char policy exports to a Hugging Face directory that `models.hf` imports bit for
bit, whose tokenizer.json encodes as the char tokenizer does; the char GPT model exports its
own weights and config and says it is not a transformers model. (The Qwen2 recipe's
end-to-end test exports its trained run too; transformers' logits of an export are checked by
scripts/make_hf_fixtures.py --check-export, outside CI.)"""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest
from conftest import REPO_ROOT
from safetensors.numpy import load_file

from sao_jax import checkpoint as ckpt_lib
from sao_jax import cli
from sao_jax.config import ConfigError, to_dict
from sao_jax.learner import make_sft_update
from sao_jax.models import hf
from sao_jax.runners.common import programs_for
from sao_jax.runners.export import REFERENCE_FILE, export_workdir
from sao_jax.setup import load_config, make_setup
from sao_jax.tokenizer import CharTokenizer, HFTokenizer

CONFIG = str(REPO_ROOT / "experiments" / "configs" / "sao_arith.py")


def _workdir(tmp_path, *overrides, steps=1):
  """A workdir holding `steps` snapshots (steps 0, 1, ...; the params moved a little each
  time) of a freshly initialised tiny policy; returns it and the last snapshot's params."""
  cfg = load_config(CONFIG, "tiny", [f"task.data_dir={tmp_path / 'tfds'}", *overrides])
  s = make_setup(cfg)
  state = programs_for(s, cfg.sft.optim, make_sft_update).init(jax.random.key(3))
  work = tmp_path / "run"
  mngr = ckpt_lib.manager(work / "checkpoints" / "sft", every=1, keep=steps, keep_best=False)
  for step in range(steps):
    state = state.replace(
      step=jax.numpy.asarray(step, state.step.dtype),
      params=jax.tree.map(lambda x, d=0.01 * (step > 0): x + d, state.params),
    )
    ckpt_lib.save(mngr, state, cfg, force=True)
  mngr.wait_until_finished()
  mngr.close()
  return work, state.params


def _flat(tree):
  return {
    "/".join(str(k.key) for k in path): np.asarray(leaf)
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
  }


def test_llama_policy_exports_to_hugging_face_and_imports_back(tmp_path):
  work, params = _workdir(tmp_path, "model.arch='llama'", "model.kv_heads=1")
  out = tmp_path / "hf"
  assert cli.main(["export", str(work), "--out", str(out), "--reference"]) == 0
  report = json.loads((out / "export.json").read_text())
  assert report["format"] == "huggingface" and report["model_type"] == "llama"
  assert report["source"]["step"] == 0 and report["not_exported"] == []
  config = hf.read_config(out)
  assert (config["num_key_value_heads"], config["tie_word_embeddings"]) == (1, True)
  assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 2, 0)
  cfg, back = hf.load(out)
  want, got = _flat(params), _flat(back)
  assert want.keys() == got.keys()
  for k in want:
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)
  # The tokenizer files: the same ids as the char tokenizer, specials named.
  tok, char = HFTokenizer(str(out / "tokenizer.json")), CharTokenizer()
  text = "Q: 12 + 7*3 = ? ~"
  assert tok.encode(text, add_bos=True, add_eos=True) == char.encode(
    text, add_bos=True, add_eos=True
  )
  assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.vocab_size) == (0, 1, 2, char.vocab_size)
  assert tok.decode(char.encode(text)) == text
  # The reference logits are the model's own on BOS + text.
  ref = np.load(out / REFERENCE_FILE)
  assert ref["logits"].shape == (*ref["input_ids"].shape, cfg.vocab_size)
  assert ref["input_ids"][0, : ref["lengths"][0]].tolist() == char.encode("12+34=46", add_bos=True)
  # A bfloat16 export: half the bytes; an earlier export is replaced, anything else refused.
  export_workdir(work, out, dtype="bfloat16")
  assert hf.read_config(out)["dtype"] == "bfloat16" and not (out / REFERENCE_FILE).exists()
  (tmp_path / "other").mkdir()
  (tmp_path / "other" / "notes.txt").write_text("mine")
  with pytest.raises(FileExistsError, match="not an earlier export"):
    export_workdir(work, tmp_path / "other")


def test_char_gpt_policy_exports_its_own_weights_and_says_what_it_is_not(
  tmp_path, capsys, monkeypatch
):
  work, params = _workdir(tmp_path)
  out = tmp_path / "gpt"
  report = export_workdir(work, out)
  assert report["format"] == "sao_jax" and "no transformers class" in report["not_exported"][0]
  assert not (out / "config.json").exists()  # nothing a transformers loader would misread
  weights = load_file(out / "model.safetensors")
  want = _flat(params)
  assert weights.keys() == want.keys() and "block_0/attn/query/kernel" in weights
  for k in want:
    np.testing.assert_array_equal(weights[k], want[k], err_msg=k)
  model = json.loads((out / "sao_jax_model.json").read_text())
  assert model["arch"] == "gpt" and model["vocab_size"] == CharTokenizer().vocab_size
  assert HFTokenizer(str(out / "tokenizer.json")).encode("7+8") == CharTokenizer().encode("7+8")
  # Errors: a missing workdir, a compressed-memory run.
  assert cli.main(["export", str(tmp_path / "nowhere"), "--out", str(out)]) == 2
  assert "no such directory" in capsys.readouterr().err
  cfg = load_config(CONFIG, "tiny")
  c = dataclasses.replace(cfg.compression, enabled=True)
  model = dataclasses.replace(
    cfg.model, memory_slots=c.visible * c.vectors_per_step, memory_dim=c.dim
  )
  memory = dataclasses.replace(cfg, compression=c, model=model)
  with monkeypatch.context() as m:
    m.setattr(ckpt_lib, "read_meta", lambda d, s=None, mngr=None: (0, {"config": to_dict(memory)}))
    with pytest.raises(ConfigError, match="compression.enabled"):
      export_workdir(work, tmp_path / "mem")


def test_a_damaged_newest_snapshot_is_skipped_by_eval_and_export_and_left_in_place(tmp_path):
  """As a resumed run does, `sao-jax eval` and `export` read the snapshot before a damaged
  one (and say so); unlike a run, they leave the workdir as they found it."""
  from sao_jax.runners.run import eval_workdir

  work, _ = _workdir(tmp_path, steps=2)
  ck = work / "checkpoints" / "sft"
  for f in (ck / "1" / "params").rglob("*"):
    if f.is_file():
      f.write_bytes(b"\0" * 7)
  before = sorted(str(p.relative_to(work)) for p in work.rglob("*"))
  with pytest.warns(RuntimeWarning, match="snapshot step 1 .* unreadable"):
    result = eval_workdir(work, num=8)
  assert (result["step"], result["skipped"], result["num_problems"]) == (0, [1], 8)
  with pytest.warns(RuntimeWarning, match="snapshot step 1"):
    report = export_workdir(work, tmp_path / "out")
  assert (report["source"]["step"], report["source"]["skipped_damaged"]) == (0, [1])
  with pytest.raises(ckpt_lib.DamagedSnapshot, match="step 1"):
    export_workdir(work, tmp_path / "out", step=1)
  assert sorted(str(p.relative_to(work)) for p in work.rglob("*")) == before


def test_eval_on_another_test_split_keeps_the_checkpoints_model(tmp_path, capsys):
  """`sao-jax eval --set task.n_ops=1`: the same policy on another split; a change of the
  model is refused."""
  from sao_jax.runners.run import eval_workdir

  work, _ = _workdir(tmp_path)
  other = eval_workdir(work, 8, ["task.n_ops=1"])
  assert other["num_problems"] == 8 and other["step"] == 0
  assert cli.main(["eval", "--workdir", str(work), "--num", "8", "--set", "model.width=64"]) == 2
  assert "may not change the checkpoint's model" in capsys.readouterr().err
