"""Host-side packing of text into the fixed-shape arrays the jitted programs take."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sao_jax.tokenizer import Tokenizer


def left_pad(rows: Sequence[Sequence[int]], length: int, pad_id: int) -> tuple[np.ndarray, ...]:
  """Right-aligns each row in [N, length]; returns (ids, valid). Rows longer than `length`
  are an error: truncating a prompt silently would change the task."""
  ids = np.full((len(rows), length), pad_id, np.int32)
  valid = np.zeros((len(rows), length), bool)
  for i, row in enumerate(rows):
    if len(row) > length:
      raise ValueError(f"row of {len(row)} tokens exceeds length {length}")
    if row:
      ids[i, length - len(row) :] = row
      valid[i, length - len(row) :] = True
  return ids, valid


def right_pad(rows: Sequence[Sequence[int]], length: int, pad_id: int) -> tuple[np.ndarray, ...]:
  ids = np.full((len(rows), length), pad_id, np.int32)
  valid = np.zeros((len(rows), length), bool)
  for i, row in enumerate(rows):
    if len(row) > length:
      raise ValueError(f"row of {len(row)} tokens exceeds length {length}")
    ids[i, : len(row)] = row
    valid[i, : len(row)] = True
  return ids, valid


def encode_prompts(tok: Tokenizer, prompts: Sequence[str], length: int):
  """BOS + prompt, left-padded: every row has at least one valid token (BOS)."""
  return left_pad([tok.encode(p, add_bos=True) for p in prompts], length, tok.pad_id)


def encode_targets(tok: Tokenizer, texts: Sequence[str], length: int):
  """Completion + EOS, right-padded."""
  return right_pad([tok.encode(t, add_eos=True) for t in texts], length, tok.pad_id)


def round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple
