"""Tokenizers behind one small interface, chosen by the `tokenizer` config string.

  "char"                       printable-ASCII characters (the generated tasks' default)
  "hf:/path/tokenizer.json"    a Hugging Face `tokenizers` file (BPE, WordPiece, ...)
  "spm:/path/tokenizer.model"  a SentencePiece model

Everything downstream (envs, sampler, learner) talks to the :class:`Tokenizer` protocol.
PAD, BOS and EOS ids come from the tokenizer: a SentencePiece model's own ids, or for a
tokenizer.json the `pad_token`/`bos_token`/`eos_token` of the tokenizer_config.json beside
it. One it lacks can be given after a `?`, as a token or an id, e.g.
"hf:/m/tokenizer.json?bos=<|endoftext|>" or "spm:/m/tokenizer.model?pad_id=0"; a missing
one is an error naming the fix. Prompts are encoded as plain text: no chat template and no
special tokens are added except the BOS/EOS the caller asks for.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Tokenizer(Protocol):
  """What the rest of the code needs from a tokenizer."""

  vocab_size: int
  pad_id: int
  bos_id: int
  eos_id: int

  def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]: ...

  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    """Text of `ids` up to the first EOS; PAD and BOS are skipped."""
    ...


class CharTokenizer:
  """Printable-ASCII character tokenizer: PAD=0, BOS=1, EOS=2, then chr(32)..chr(126)."""

  _OFFSET = 3
  _FIRST, _LAST = 32, 126

  def __init__(self):
    self.pad_id, self.bos_id, self.eos_id = 0, 1, 2
    self.vocab_size = self._OFFSET + self._LAST - self._FIRST + 1

  def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
    ids = []
    for ch in text:
      code = ord(ch)
      if not self._FIRST <= code <= self._LAST:
        raise ValueError(f"CharTokenizer cannot encode {ch!r} (only printable ASCII) in {text!r}")
      ids.append(code - self._FIRST + self._OFFSET)
    if add_bos:
      ids.insert(0, self.bos_id)
    if add_eos:
      ids.append(self.eos_id)
    return ids

  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    out = []
    for i in np.asarray(ids).tolist():
      if i == self.eos_id:
        break
      if i >= self._OFFSET:
        out.append(chr(i - self._OFFSET + self._FIRST))
    return "".join(out)


_SPECIALS = ("pad", "bos", "eos")


def _parse_spec(spec: str) -> tuple[str, dict[str, str]]:
  """'PATH?pad=<t>&eos_id=2' -> ('PATH', {'pad': '<t>', 'eos_id': '2'})."""
  path, sep, query = spec.partition("?")
  opts: dict[str, str] = {}
  for item in query.split("&") if sep else ():
    key, eq, value = item.partition("=")
    allowed = _SPECIALS + tuple(f"{k}_id" for k in _SPECIALS)
    if not eq or key not in allowed:
      raise ValueError(
        f"tokenizer option {item!r} in {spec!r}: expected one of "
        f"{', '.join(k + '=...' for k in allowed)}"
      )
    opts[key] = value
  return path, opts


def _special_ids(
  spec: str, found: dict[str, int | None], opts: dict[str, str], token_to_id, vocab_size: int
) -> dict[str, int]:
  """PAD/BOS/EOS ids: an option ('eos=<tok>' or 'eos_id=N') wins over what the tokenizer
  names; each must exist and lie inside the vocabulary."""
  ids = {}
  for name in _SPECIALS:
    if f"{name}_id" in opts:
      try:
        value = int(opts[f"{name}_id"])
      except ValueError:
        raise ValueError(f"{spec!r}: {name}_id must be an integer") from None
    elif name in opts:
      value = token_to_id(opts[name])
      if value is None:
        raise ValueError(f"{spec!r}: {name} token {opts[name]!r} is not in the vocabulary")
    else:
      value = found.get(name)
    if value is None:
      raise ValueError(
        f"tokenizer {spec!r} has no {name.upper()} token; name one with "
        f"'?{name}=<token>' or '?{name}_id=<id>'"
      )
    if not 0 <= value < vocab_size:
      raise ValueError(f"{spec!r}: {name} id {value} outside the vocabulary (0..{vocab_size - 1})")
    ids[name] = value
  return ids


def _kept_ids(
  ids: Sequence[int] | np.ndarray, eos_id: int, skip: tuple[int, ...], vocab_size: int
) -> list[int]:
  """Ids before the first EOS, without `skip` ids and ids past the tokenizer's vocabulary
  (a model's output layer may be padded beyond it)."""
  out = []
  for i in np.asarray(ids).tolist():
    if i == eos_id:
      break
    if i not in skip and 0 <= i < vocab_size:
      out.append(i)
  return out


class HFTokenizer:
  """A Hugging Face tokenizer.json, through the `tokenizers` library."""

  def __init__(self, spec: str):
    from tokenizers import Tokenizer as _Backend

    path, opts = _parse_spec(spec)
    file = pathlib.Path(path)
    if not file.is_file():
      raise ValueError(f"tokenizer file {path!r} not found")
    self._tok = _Backend.from_file(str(file))
    self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
    found: dict[str, int | None] = {}
    config = file.parent / "tokenizer_config.json"
    if config.is_file():
      settings = json.loads(config.read_text())
      for name in _SPECIALS:
        token = settings.get(f"{name}_token")
        if isinstance(token, dict):  # serialised AddedToken
          token = token.get("content")
        found[name] = self._tok.token_to_id(token) if token else None
    ids = _special_ids(spec, found, opts, self._tok.token_to_id, self.vocab_size)
    self.pad_id, self.bos_id, self.eos_id = ids["pad"], ids["bos"], ids["eos"]

  def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
    ids = self._tok.encode(text, add_special_tokens=False).ids
    return [self.bos_id] * add_bos + ids + [self.eos_id] * add_eos

  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    kept = _kept_ids(ids, self.eos_id, (self.pad_id, self.bos_id), self.vocab_size)
    return self._tok.decode(kept, skip_special_tokens=False)


class SentencePieceTokenizer:
  """A SentencePiece model file, through the `sentencepiece` library."""

  def __init__(self, spec: str):
    import sentencepiece

    path, opts = _parse_spec(spec)
    if not pathlib.Path(path).is_file():
      raise ValueError(f"SentencePiece model {path!r} not found")
    self._sp = sentencepiece.SentencePieceProcessor(model_file=path)
    self.vocab_size = self._sp.get_piece_size()
    found = {name: getattr(self._sp, f"{name}_id")() for name in _SPECIALS}
    found = {k: (v if v >= 0 else None) for k, v in found.items()}  # -1: not defined

    def token_to_id(token: str) -> int | None:
      i = self._sp.piece_to_id(token)
      return i if self._sp.id_to_piece(i) == token else None

    ids = _special_ids(spec, found, opts, token_to_id, self.vocab_size)
    self.pad_id, self.bos_id, self.eos_id = ids["pad"], ids["bos"], ids["eos"]

  def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
    ids = self._sp.encode(text)
    return [self.bos_id] * add_bos + ids + [self.eos_id] * add_eos

  def decode(self, ids: Sequence[int] | np.ndarray) -> str:
    return self._sp.decode(_kept_ids(ids, self.eos_id, (self.pad_id, self.bos_id), self.vocab_size))


def save_for_hf(name: str, out: str | pathlib.Path) -> list[str]:
  """Writes the tokenizer a config string names into the directory `out` in the files a
  Hugging Face loader reads, with a tokenizer_config.json naming its PAD/BOS/EOS tokens (the
  ones this code used, options after `?` included); returns the file names written.

    "hf:PATH"   tokenizer.json (copied) and tokenizer_config.json (the one beside PATH, if
                any, with the special tokens set);
    "spm:PATH"  tokenizer.model (copied) and tokenizer_config.json;
    "char"      a tokenizer.json built with `tokenizers` that encodes every printable ASCII
                character to the id CharTokenizer gives it (a one-character WordLevel model;
                anything else, which CharTokenizer refuses, becomes PAD), and
                tokenizer_config.json.
  """
  import shutil

  out = pathlib.Path(out)
  out.mkdir(parents=True, exist_ok=True)
  tok = get_tokenizer(name)
  kind, _, spec = name.partition(":")
  path = pathlib.Path(_parse_spec(spec)[0]) if spec else None
  settings: dict = {}
  if kind == "hf":
    shutil.copyfile(path, out / "tokenizer.json")
    beside = path.parent / "tokenizer_config.json"
    settings = json.loads(beside.read_text()) if beside.is_file() else {}
    settings.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    token = tok._tok.id_to_token
    files = ["tokenizer.json"]
  elif kind == "spm":
    shutil.copyfile(path, out / "tokenizer.model")
    settings = {"tokenizer_class": "LlamaTokenizer", "add_bos_token": False}
    token = tok._sp.id_to_piece
    files = ["tokenizer.model"]
  else:
    (out / "tokenizer.json").write_text(_char_tokenizer_json(tok))
    settings = {"tokenizer_class": "PreTrainedTokenizerFast"}
    token = {tok.pad_id: "<pad>", tok.bos_id: "<s>", tok.eos_id: "</s>"}.get
    files = ["tokenizer.json"]
  for special in _SPECIALS:
    settings[f"{special}_token"] = token(getattr(tok, f"{special}_id"))
  settings["model_max_length"] = settings.get("model_max_length", 1_000_000)
  (out / "tokenizer_config.json").write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")
  return [*files, "tokenizer_config.json"]


def _char_tokenizer_json(tok: CharTokenizer) -> str:
  from tokenizers import Regex, decoders, models, pre_tokenizers
  from tokenizers import Tokenizer as _Backend

  specials = {"<pad>": tok.pad_id, "<s>": tok.bos_id, "</s>": tok.eos_id}
  vocab = {**specials, **{chr(c): tok.encode(chr(c))[0] for c in range(tok._FIRST, tok._LAST + 1)}}
  backend = _Backend(models.WordLevel(vocab, unk_token="<pad>"))
  backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
  backend.decoder = decoders.Fuse()
  backend.add_special_tokens(list(specials))
  return backend.to_str(pretty=True)


def get_tokenizer(name: str) -> Tokenizer:
  """The tokenizer a config string names (see the module docstring)."""
  if name == "char":
    return CharTokenizer()
  kind, sep, spec = name.partition(":")
  if sep and kind == "hf":
    return HFTokenizer(spec)
  if sep and kind == "spm":
    return SentencePieceTokenizer(spec)
  raise ValueError(f"unknown tokenizer {name!r}; known: 'char', 'hf:PATH', 'spm:PATH'")
