import json
import pathlib

import numpy as np
import pytest

from sao_jax.tokenizer import CharTokenizer, Tokenizer, get_tokenizer


def test_roundtrip_and_specials():
  tok = get_tokenizer("char")
  assert isinstance(tok, Tokenizer)
  text = "Ann had 7 eggs, got 5. Eggs? 7+5=12;#12"
  ids = tok.encode(text, add_bos=True, add_eos=True)
  assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
  assert tok.decode(ids) == text
  assert max(ids) < tok.vocab_size == 98


def test_decode_stops_at_eos_and_skips_pad():
  tok = CharTokenizer()
  ids = tok.encode("12") + [tok.eos_id] + tok.encode("junk")
  assert tok.decode(np.array([tok.pad_id] + ids)) == "12"


def test_rejects_unencodable():
  with pytest.raises(ValueError, match="cannot encode"):
    CharTokenizer().encode("naïve")
  with pytest.raises(ValueError, match="unknown tokenizer"):
    get_tokenizer("bpe-9000")


# ---------------------------------------------------------------- real tokenizers

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "hf"


def _reference(name):
  return json.loads((FIXTURES / name / "reference.json").read_text())


def test_hf_tokenizer_matches_the_fixture_checkpoints_reference():
  path = FIXTURES / "qwen2_tiny" / "tokenizer.json"
  # Qwen-style: tokenizer_config.json names EOS and PAD but no BOS.
  with pytest.raises(ValueError, match=r"no BOS token; name one with '\?bos=<token>'"):
    get_tokenizer(f"hf:{path}")
  tok = get_tokenizer(f"hf:{path}?bos=<|im_start|>")
  assert isinstance(tok, Tokenizer)
  assert (tok.pad_id, tok.eos_id, tok.bos_id) == (0, 0, 1) and tok.vocab_size == 300
  ref = _reference("qwen2_tiny")
  for text, ids in zip(ref["prompts"], ref["input_ids"], strict=True):
    assert tok.encode(text) == ids
    assert tok.encode(text, add_bos=True, add_eos=True) == [tok.bos_id] + ids + [tok.eos_id]
    assert tok.decode([tok.bos_id] + ids + [tok.eos_id] + ids) == text
  # Ids past the tokenizer's vocabulary (the model's output layer is padded to 320) are dropped.
  assert tok.decode(ref["input_ids"][2] + [310, 319]) == ref["prompts"][2]
  tok = get_tokenizer(f"hf:{path}?bos_id=2&eos=<|im_end|>")
  assert (tok.bos_id, tok.eos_id) == (2, 2)


def test_spm_tokenizer_matches_the_fixture_checkpoints_reference():
  path = FIXTURES / "llama_tiny" / "tokenizer.model"
  with pytest.raises(ValueError, match="no PAD token"):
    get_tokenizer(f"spm:{path}")
  tok = get_tokenizer(f"spm:{path}?pad=<unk>")
  assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.vocab_size) == (0, 1, 2, 352)
  ref = _reference("llama_tiny")
  for text, ids in zip(ref["prompts"], ref["input_ids"], strict=True):
    assert tok.encode(text, add_bos=True) == ids  # Llama prepends BOS
    assert tok.decode(ids + [tok.eos_id, 300]) == text
  assert tok.decode([tok.pad_id, 400, -1] + tok.encode("12 eggs")) == "12 eggs"


def test_tokenizer_json_trained_here(tmp_path):
  from tokenizers import Tokenizer as Backend
  from tokenizers import models, pre_tokenizers, trainers

  backend = Backend(models.BPE(unk_token="[UNK]"))
  backend.pre_tokenizer = pre_tokenizers.Whitespace()
  trainer = trainers.BpeTrainer(
    vocab_size=80, special_tokens=["[UNK]", "[PAD]", "[BOS]", "[EOS]"], show_progress=False
  )
  backend.train_from_iterator(["Ann had 7 eggs, got 5.", "Tom had 12 keys, lost 3."] * 5, trainer)
  file = tmp_path / "tokenizer.json"
  backend.save(str(file))
  # No tokenizer_config.json: every special must be named.
  with pytest.raises(ValueError, match="no PAD token"):
    get_tokenizer(f"hf:{file}")
  with pytest.raises(ValueError, match="token '<s>' is not in the vocabulary"):
    get_tokenizer(f"hf:{file}?pad=[PAD]&bos=<s>&eos=[EOS]")
  with pytest.raises(ValueError, match="outside the vocabulary"):
    get_tokenizer(f"hf:{file}?pad=[PAD]&bos=[BOS]&eos_id=999")
  with pytest.raises(ValueError, match="tokenizer option 'sep=x'"):
    get_tokenizer(f"hf:{file}?sep=x")
  (tmp_path / "tokenizer_config.json").write_text(
    json.dumps({"pad_token": "[PAD]", "bos_token": {"content": "[BOS]"}, "eos_token": "[EOS]"})
  )
  tok = get_tokenizer(f"hf:{file}")
  assert (tok.pad_id, tok.bos_id, tok.eos_id) == (1, 2, 3)
  ids = tok.encode("Tom had 7 keys", add_bos=True, add_eos=True)
  assert ids[0] == 2 and ids[-1] == 3 and tok.decode(ids) == "Tom had 7 keys"
  with pytest.raises(ValueError, match="not found"):
    get_tokenizer(f"spm:{tmp_path / 'missing.model'}")
