"""Self-describing binary records: the only form in which samplers and the learner talk.

A record is a fixed header plus named numpy arrays and a small JSON metadata object. It is
used instead of pickle because the same bytes travel through a multiprocessing queue today and
a Kafka topic later, possibly between machines and code versions: a corrupt, foreign or hostile
message must be rejected with a `RecordError`, never executed and never allowed to allocate
memory it does not carry. Everything is little-endian, with no padding.

Header (32 bytes, `HEADER`; enough on its own for routing and dedup, see `peek_header`):

| offset | size | type   | field          | meaning                                             |
|-------:|-----:|--------|----------------|-----------------------------------------------------|
|      0 |    4 | bytes  | magic          | `b"SAOR"`                                           |
|      4 |    2 | uint16 | schema version | `SCHEMA_VERSION` (1); a reader rejects any other    |
|      6 |    1 | uint8  | kind           | `RecordKind`: 1 trajectory, 2 task, 3 params, 4 ctl,|
|        |      |        |                |  5 long trajectory (compressed-memory policy)       |
|      7 |    1 | uint8  | flags          | reserved: written 0, and a v1 reader rejects others |
|      8 |    8 | uint64 | record id      | trajectory / record id                              |
|     16 |    8 | int64  | policy version | version of the policy that produced the record      |
|     24 |    4 | uint32 | payload length | bytes that follow the header                        |
|     28 |    4 | uint32 | checksum       | CRC32C of header bytes 0..27, then of the payload   |

The checksum covers the header fields as well as the payload: a flipped bit in the policy
version would otherwise pass silently into the learner's staleness filter.

Payload:

| size                   | type   | field                                       |
|------------------------|--------|---------------------------------------------|
| 4                      | uint32 | meta length M                               |
| M                      | utf-8  | meta: a strict JSON object (no NaN / inf)   |
| 4                      | uint32 | array count N                               |
| then N times:          |        |                                             |
| 2                      | uint16 | name length L                               |
| L                      | utf-8  | name (non-empty, unique within the record)  |
| 1                      | uint8  | dtype code, from `DTYPE_CODES`              |
| 1                      | uint8  | ndim D (at most `MAX_NDIM`)                 |
| 4 * D                  | uint32 | shape                                       |
| prod(shape) * itemsize | raw    | data, C order, little-endian                |

Meta is for scalars (task id, reward, timings); arrays are for anything bulky. Only the dtypes
in `DTYPE_CODES` are accepted, so no object, string or structured data can ride along.

Quantised data (the compressed memory's INT8 bank, `sao_jax.compression.quant`) travels as
two plain arrays, the int8 values and their float32 scales. A long-horizon trajectory of the
policy with compressed memory (`sao_jax.compression.rollout.LongTrajectory`: its steps, the
final bank and the graveyard of evicted entries) has its own kind, so that a learner of the
other policy drops it as malformed instead of batching it; its array layout carries a version
of its own in the meta (`layout`).

Decoded arrays are fresh, writable copies in native byte order: they never alias the
message buffer, which a transport may reuse.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import operator
import struct
from collections.abc import Mapping
from typing import Any

import crc32c
import numpy as np
import numpy.typing as npt

MAGIC = b"SAOR"
SCHEMA_VERSION = 1
DEFAULT_MAX_BYTES = 8 * 1024 * 1024
MAX_NDIM = 32

_PREFIX = struct.Struct("<4sHBBQqI")  # the header up to, not including, the checksum
HEADER = struct.Struct("<4sHBBQqII")
HEADER_SIZE = HEADER.size
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_DTYPE_NDIM = struct.Struct("<BB")
# Name length, a one-byte name, dtype code and ndim: lets a claimed array count be checked
# against the bytes left before looping over it.
_MIN_ARRAY_BYTES = _U16.size + 1 + _DTYPE_NDIM.size
# numpy refuses shapes whose non-zero dimensions multiply past intp, even for empty arrays.
_MAX_SHAPE_BYTES = 2**62


class RecordKind(enum.IntEnum):
  TRAJECTORY = 1
  TASK = 2
  PARAMS = 3
  CONTROL = 4
  LONG_TRAJECTORY = 5


# One-byte codes rather than dtype strings: a fixed whitelist that cannot name object dtypes.
DTYPE_CODES: dict[str, int] = {
  "bool": 1,
  "int8": 2,
  "uint8": 3,
  "int16": 4,
  "int32": 5,
  "int64": 6,
  "float16": 7,
  "float32": 8,
  "float64": 9,
}
_CODE_DTYPES: dict[int, np.dtype] = {
  code: np.dtype(name).newbyteorder("<") for name, code in DTYPE_CODES.items()
}


class RecordError(ValueError):
  """Base of every error `encode` and `decode` raise on bad input: catch this to drop a message."""


class BadMagic(RecordError):
  """The bytes do not start with `MAGIC`: not a record at all."""


class SchemaMismatch(RecordError):
  """A record of another schema version, from a newer or older writer."""


class Truncated(RecordError):
  """Fewer bytes than the header or an array claims."""


class ChecksumMismatch(RecordError):
  """The CRC32C does not match: corrupted on the way."""


class Malformed(RecordError):
  """Not what any writer of this schema produces: trailing bytes, unknown kind, flags or dtype
  code, bad names or meta. Behind a matching checksum it means a buggy or foreign writer."""


class RecordTooLarge(RecordError):
  """Over the size limit; `size` and `limit` are in bytes, so callers can split and retry."""

  def __init__(self, size: int, limit: int):
    super().__init__(
      f"record of {size} bytes exceeds the limit of {limit} bytes "
      f"({size / 2**20:.2f} MiB > {limit / 2**20:.2f} MiB)"
    )
    self.size = size
    self.limit = limit


@dataclasses.dataclass(frozen=True)
class Header:
  """What `peek_header` reads without touching the payload; `nbytes` is the whole record."""

  kind: RecordKind
  record_id: int
  policy_version: int
  payload_length: int
  checksum: int

  @property
  def nbytes(self) -> int:
    return HEADER_SIZE + self.payload_length


@dataclasses.dataclass(frozen=True)
class Record:
  """A decoded record; `nbytes` is its size on the wire, for throughput and size metrics."""

  kind: RecordKind
  record_id: int
  policy_version: int
  arrays: dict[str, np.ndarray]
  meta: dict[str, Any]
  nbytes: int


def encode(
  kind: RecordKind | int,
  record_id: int,
  policy_version: int,
  arrays: Mapping[str, npt.ArrayLike],
  meta: Mapping[str, Any] | None = None,
  *,
  max_bytes: int = DEFAULT_MAX_BYTES,
) -> bytes:
  """Serialises one record. Raises `RecordTooLarge` before building anything over `max_bytes`,
  and `RecordError` for values the format cannot carry faithfully."""
  kind = _record_kind(kind)
  record_id = _int_in_range(record_id, 0, 2**64, "record_id")
  policy_version = _int_in_range(policy_version, -(2**63), 2**63, "policy_version")
  meta_bytes = _encode_meta(meta)
  parts: list[bytes | np.ndarray] = [_U32.pack(len(meta_bytes)), meta_bytes, _U32.pack(len(arrays))]
  for name, value in arrays.items():
    parts.extend(_encode_array(name, value))
  payload_length = sum(len(part) for part in parts)
  size = HEADER_SIZE + payload_length
  limit = min(max_bytes, HEADER_SIZE + 0xFFFFFFFF)
  if size > limit:
    raise RecordTooLarge(size, limit)
  prefix = _PREFIX.pack(MAGIC, SCHEMA_VERSION, kind, 0, record_id, policy_version, payload_length)
  checksum = crc32c.crc32c(prefix)
  for part in parts:
    checksum = crc32c.crc32c(part, checksum)
  return b"".join([prefix, _U32.pack(checksum), *parts])


def peek_header(
  data: bytes | bytearray | memoryview, *, max_bytes: int = DEFAULT_MAX_BYTES
) -> Header:
  """Reads only the header, for routing and dedup. The checksum is not verified here (that
  needs the whole payload): trust nothing in it until `decode` succeeds."""
  _, _, kind, flags, record_id, policy_version, payload_length, checksum = _unpack_header(
    _byte_view(data), max_bytes
  )
  return Header(_checked_kind(kind, flags), record_id, policy_version, payload_length, checksum)


def decode(data: bytes | bytearray | memoryview, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Record:
  """Parses and verifies one record occupying all of `data`. Any byte string either decodes or
  raises a `RecordError` subclass; data that is not bytes-like is a `TypeError`."""
  view = _byte_view(data)
  _, _, kind, flags, record_id, policy_version, payload_length, checksum = _unpack_header(
    view, max_bytes
  )
  end = HEADER_SIZE + payload_length
  if len(view) < end:
    raise Truncated(f"header claims a {end}-byte record but only {len(view)} bytes arrived")
  if len(view) > end:
    raise Malformed(f"{len(view) - end} bytes follow the {end}-byte record")
  actual = crc32c.crc32c(view[HEADER_SIZE:], crc32c.crc32c(view[: _PREFIX.size]))
  if actual != checksum:
    raise ChecksumMismatch(
      f"CRC32C is {actual:#010x} but the header says {checksum:#010x}: the record was corrupted"
    )
  record_kind = _checked_kind(kind, flags)
  meta, arrays = _decode_payload(view[HEADER_SIZE:])
  return Record(record_kind, record_id, policy_version, arrays, meta, end)


def _record_kind(kind: RecordKind | int) -> RecordKind:
  try:
    return RecordKind(kind)
  except ValueError:
    raise RecordError(f"unknown record kind {kind!r}; expected one of {list(RecordKind)}") from None


def _int_in_range(value: int, low: int, high: int, what: str) -> int:
  try:
    value = operator.index(value)
  except TypeError:
    raise RecordError(f"{what} must be an integer, got {type(value).__name__}") from None
  if not low <= value < high:
    raise RecordError(f"{what}={value} is outside [{low}, {high})")
  return value


def _json_default(obj: Any) -> Any:
  # Rewards and timings are usually numpy scalars; they are plain numbers once unwrapped.
  if isinstance(obj, np.generic):
    return obj.item()
  raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def _encode_meta(meta: Mapping[str, Any] | None) -> bytes:
  if meta is None:
    meta = {}
  if not isinstance(meta, Mapping):
    raise RecordError(f"meta must be a mapping, got {type(meta).__name__}")
  try:
    return json.dumps(
      dict(meta), ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=_json_default
    ).encode("utf-8")
  except (TypeError, ValueError, RecursionError) as e:
    raise RecordError(f"meta is not strict JSON (no NaN/inf, only JSON types): {e}") from None


def _encode_array(name: str, value: npt.ArrayLike) -> tuple[bytes, np.ndarray]:
  """Returns the array's descriptor and its data as a flat little-endian uint8 view."""
  if not isinstance(name, str) or not name:
    raise RecordError(f"array names must be non-empty strings, got {name!r}")
  try:
    name_bytes = name.encode("utf-8")
    array = np.asarray(value)
  except ValueError as e:
    raise RecordError(f"array {name!r}: {e}") from None
  if len(name_bytes) > 0xFFFF:
    raise RecordError(f"array name of {len(name_bytes)} bytes is over 65535: {name[:40]!r}...")
  code = DTYPE_CODES.get(array.dtype.name)
  if code is None:
    raise RecordError(f"array {name!r} has dtype {array.dtype}, not one of {list(DTYPE_CODES)}")
  if array.ndim > MAX_NDIM:
    raise RecordError(f"array {name!r} has {array.ndim} dimensions, over {MAX_NDIM}")
  if any(dim > 0xFFFFFFFF for dim in array.shape):
    raise RecordError(f"array {name!r} has a dimension over 2**32 - 1: {array.shape}")
  array = np.asarray(array, dtype=array.dtype.newbyteorder("<"), order="C")
  descriptor = b"".join(
    [
      _U16.pack(len(name_bytes)),
      name_bytes,
      _DTYPE_NDIM.pack(code, array.ndim),
      struct.pack(f"<{array.ndim}I", *array.shape),
    ]
  )
  return descriptor, array.reshape(-1).view(np.uint8)


def _byte_view(data: bytes | bytearray | memoryview) -> memoryview:
  return memoryview(data).cast("B")


def _unpack_header(view: memoryview, max_bytes: int) -> tuple:
  """Checks what can be checked before the payload: magic, version and size."""
  magic = bytes(view[: len(MAGIC)])
  if magic != MAGIC[: len(magic)]:
    raise BadMagic(f"not a record: starts with {magic!r}, expected {MAGIC!r}")
  if len(view) < HEADER_SIZE:
    raise Truncated(f"{len(view)} bytes is shorter than the {HEADER_SIZE}-byte header")
  fields = HEADER.unpack_from(view)
  version, payload_length = fields[1], fields[6]
  if version != SCHEMA_VERSION:
    raise SchemaMismatch(
      f"record has schema version {version}; this reader understands only version {SCHEMA_VERSION}"
    )
  if HEADER_SIZE + payload_length > max_bytes:
    raise RecordTooLarge(HEADER_SIZE + payload_length, max_bytes)
  return fields


def _checked_kind(kind: int, flags: int) -> RecordKind:
  if flags:
    raise Malformed(f"reserved flags are {flags:#04x}; schema {SCHEMA_VERSION} writes 0")
  try:
    return RecordKind(kind)
  except ValueError:
    raise Malformed(f"unknown record kind {kind}") from None


class _Cursor:
  """Reads the payload front to back; every read is bounds-checked and raises `Truncated`."""

  def __init__(self, view: memoryview):
    self.view = view
    self.pos = 0

  @property
  def remaining(self) -> int:
    return len(self.view) - self.pos

  def take(self, n: int, what: str) -> memoryview:
    if n > self.remaining:
      raise Truncated(
        f"{what} needs {n} bytes at payload offset {self.pos}, but only {self.remaining} remain"
      )
    self.pos += n
    return self.view[self.pos - n : self.pos]

  def unpack(self, fmt: struct.Struct, what: str) -> tuple:
    return fmt.unpack(self.take(fmt.size, what))


def _decode_payload(payload: memoryview) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  cursor = _Cursor(payload)
  (meta_length,) = cursor.unpack(_U32, "meta length")
  meta = _decode_meta(cursor.take(meta_length, "meta"))
  (count,) = cursor.unpack(_U32, "array count")
  if count * _MIN_ARRAY_BYTES > cursor.remaining:
    raise Truncated(f"{count} arrays cannot fit in the {cursor.remaining} bytes left")
  arrays: dict[str, np.ndarray] = {}
  for index in range(count):
    (name_length,) = cursor.unpack(_U16, f"array {index} name length")
    name = _decode_name(cursor.take(name_length, f"array {index} name"), index)
    if name in arrays:
      raise Malformed(f"array name {name!r} appears twice")
    code, ndim = cursor.unpack(_DTYPE_NDIM, f"array {name!r} dtype and ndim")
    dtype = _CODE_DTYPES.get(code)
    if dtype is None:
      raise Malformed(f"array {name!r} has unknown dtype code {code}")
    if ndim > MAX_NDIM:
      raise Malformed(f"array {name!r} claims {ndim} dimensions, over {MAX_NDIM}")
    shape = struct.unpack(f"<{ndim}I", cursor.take(4 * ndim, f"array {name!r} shape"))
    nbytes = math.prod(shape) * dtype.itemsize
    data = cursor.take(nbytes, f"array {name!r} of shape {shape} and dtype {dtype.name}")
    if math.prod(max(dim, 1) for dim in shape) * dtype.itemsize > _MAX_SHAPE_BYTES:
      raise Malformed(f"array {name!r} claims the impossible shape {shape}")
    arrays[name] = _copy_array(data, dtype, shape)
  if cursor.remaining:
    raise Malformed(f"{cursor.remaining} bytes follow the last array")
  return meta, arrays


def _decode_name(raw: memoryview, index: int) -> str:
  try:
    name = bytes(raw).decode("utf-8")
  except UnicodeDecodeError as e:
    raise Malformed(f"array {index} name is not UTF-8: {e}") from None
  if not name:
    raise Malformed(f"array {index} has an empty name")
  return name


def _reject_constant(token: str) -> Any:
  raise ValueError(f"{token} is not strict JSON")


def _decode_meta(raw: memoryview) -> dict[str, Any]:
  try:
    meta = json.loads(bytes(raw).decode("utf-8"), parse_constant=_reject_constant)
  except (ValueError, RecursionError) as e:
    raise Malformed(f"meta is not strict UTF-8 JSON: {e}") from None
  if not isinstance(meta, dict):
    raise Malformed(f"meta must be a JSON object, got {type(meta).__name__}")
  return meta


def _copy_array(data: memoryview, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
  """A writable native-order copy; bools are normalised so that stray bytes read as True."""
  if dtype == np.bool_:
    return (np.frombuffer(data, dtype=np.uint8) != 0).reshape(shape)
  return np.frombuffer(data, dtype=dtype).astype(dtype.newbyteorder("=")).reshape(shape)
