"""Tokenizers behind one small interface.

The generated tasks only need characters, but everything downstream (envs, sampler,
learner) talks to the :class:`Tokenizer` protocol, so a SentencePiece/BPE tokenizer can
be dropped in by implementing the same five members.
"""
from __future__ import annotations

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

  def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
    ...

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


def get_tokenizer(name: str) -> Tokenizer:
  if name == "char":
    return CharTokenizer()
  raise ValueError(f"unknown tokenizer {name!r}; known: 'char'")
