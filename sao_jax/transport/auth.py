"""Per-run authentication of everything that crosses between the learner and its samplers.

The learner of a run creates a random 256-bit key once (`load_or_create`: WORKDIR/run.key,
readable by its owner only, kept across resumes so that records already on the broker stay
valid) and never writes it into config.json, metrics, an announcement or a record. Its local
samplers receive it in memory with their spec; a sampler on another machine gets it out of
band: `sao-jax sampler --key-file PATH` (a copy of run.key) or the environment variable
SAO_JAX_RUN_KEY (the key's hex digits).

Under that key every message carries an HMAC-SHA256 tag (`seal`: the 32 tag bytes appended
to the message): trajectory records (sampler -> learner), task records and control
announcements (learner -> samplers, over Kafka), and each published parameter version (its
tag in the announcement, over the file's bytes and its (lineage, version)). A receiver checks
the tag before it decodes anything (`unseal`): a message without a valid one, from a client
that can reach the broker but does not hold the key, is rejected and counted. The tag is
compared in constant time (`hmac.compare_digest`).

What this does not do: encrypt (that is TLS's job, between clients and broker), or
tell one sampler holding the key from another (the admission guard's per-sampler accounting
does that, on the record ids' random prefixes).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import pathlib

KEY_BYTES = 32
TAG_BYTES = 32
KEY_FILE = "run.key"
KEY_ENV = "SAO_JAX_RUN_KEY"


class Unauthenticated(ValueError):
  """A message without a valid tag under the run's key."""


def new_key() -> bytes:
  return os.urandom(KEY_BYTES)


def parse_key(text: str, where: str) -> bytes:
  """A key from its hex digits (as run.key and SAO_JAX_RUN_KEY hold it)."""
  try:
    key = bytes.fromhex(text.strip())
  except ValueError:
    raise ValueError(f"{where}: not a run key (expected {2 * KEY_BYTES} hex digits)") from None
  if len(key) != KEY_BYTES:
    raise ValueError(f"{where}: a run key has {2 * KEY_BYTES} hex digits, not {2 * len(key)}")
  return key


def read_key_file(path: str | os.PathLike) -> bytes:
  path = pathlib.Path(path)
  try:
    return parse_key(path.read_text(), str(path))
  except OSError as err:
    raise ValueError(f"run key file {path}: {err.strerror or err}") from None


def load_or_create(workdir: str | os.PathLike) -> bytes:
  """The run's key: WORKDIR/run.key if it exists (a resumed run), else a new one written
  there with mode 0600 (created exclusively: two learners never write two keys)."""
  path = pathlib.Path(workdir) / KEY_FILE
  if path.exists():
    return read_key_file(path)
  key = new_key()
  path.parent.mkdir(parents=True, exist_ok=True)
  try:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
  except FileExistsError:  # another process of this run made it first
    return read_key_file(path)
  with os.fdopen(fd, "w") as f:
    f.write(key.hex() + "\n")
  return key


def key_from(key_file: str | None = None) -> bytes | None:
  """A sampler's key from --key-file, else from SAO_JAX_RUN_KEY, else None."""
  if key_file:
    return read_key_file(key_file)
  text = os.environ.get(KEY_ENV)
  return parse_key(text, KEY_ENV) if text else None


def tag(key: bytes, data: bytes | bytearray | memoryview) -> bytes:
  return hmac.new(key, data, hashlib.sha256).digest()


def seal(key: bytes | None, data: bytes) -> bytes:
  """`data` with its tag appended (unchanged when there is no key)."""
  return data if key is None else bytes(data) + tag(key, data)


def unseal(key: bytes | None, data: bytes | bytearray | memoryview) -> bytes:
  """The message of a sealed `data` after checking its tag (unchanged when there is no key).
  Raises Unauthenticated when the tag is missing or wrong."""
  if key is None:
    return bytes(data)
  view = memoryview(data)
  if len(view) < TAG_BYTES:
    raise Unauthenticated(f"a {len(view)}-byte message cannot carry a {TAG_BYTES}-byte tag")
  body, got = view[:-TAG_BYTES], bytes(view[-TAG_BYTES:])
  if not hmac.compare_digest(tag(key, body), got):
    raise Unauthenticated("its tag does not match the run key (not from a holder of the key)")
  return bytes(body)
