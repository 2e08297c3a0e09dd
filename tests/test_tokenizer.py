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
