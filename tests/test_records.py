"""The record format is the trust boundary between processes (and later machines): these tests
pin its bytes, and check that no input can make `decode` fail in any way but a `RecordError`."""

from __future__ import annotations

import random
import struct

import crc32c
import numpy as np
import pytest

from sao_jax.transport import records as R
from sao_jax.transport.records import RecordKind

# encode(TRAJECTORY, 0x0102030405060708, -2, {"a": int8 [1, -1]}, {"t": 1}), computed once.
GOLDEN_HEX = (
  "53414f52"
  "0100"
  "01"
  "00"
  "0807060504030201"
  "feffffffffffffff"
  "1a000000"
  "3030eb4b"
  "07000000"
  "7b2274223a317d"
  "01000000"
  "0100"
  "61"
  "02"
  "01"
  "02000000"
  "01ff"
)


def _seal(
  payload: bytes,
  *,
  version: int = R.SCHEMA_VERSION,
  kind: int = 1,
  flags: int = 0,
  record_id: int = 0,
  policy_version: int = 0,
  length: int | None = None,
) -> bytes:
  """A record with a correct checksum around an arbitrary payload, to reach the payload parser
  with inputs no writer would produce."""
  length = len(payload) if length is None else length
  prefix = R._PREFIX.pack(R.MAGIC, version, kind, flags, record_id, policy_version, length)
  checksum = crc32c.crc32c(payload, crc32c.crc32c(prefix))
  return prefix + struct.pack("<I", checksum) + payload


def _reseal(data: bytes, *, fix_length: bool) -> bytes:
  """Recomputes the checksum of a (mutated) record, optionally its payload length too."""
  if len(data) < R.HEADER_SIZE:
    return data
  fields = list(R._PREFIX.unpack_from(data))
  if fix_length:
    fields[-1] = len(data) - R.HEADER_SIZE
  prefix = R._PREFIX.pack(*fields)
  payload = data[R.HEADER_SIZE :]
  checksum = crc32c.crc32c(payload, crc32c.crc32c(prefix))
  return prefix + struct.pack("<I", checksum) + payload


def _payload(meta: bytes = b"{}", *arrays: bytes, count: int | None = None) -> bytes:
  count = len(arrays) if count is None else count
  return struct.pack("<I", len(meta)) + meta + struct.pack("<I", count) + b"".join(arrays)


def _array(name: bytes, code: int, shape: tuple[int, ...], data: bytes = b"") -> bytes:
  return (
    struct.pack("<H", len(name))
    + name
    + struct.pack("<BB", code, len(shape))
    + struct.pack(f"<{len(shape)}I", *shape)
    + data
  )


def _sample_record() -> bytes:
  return R.encode(
    RecordKind.TRAJECTORY,
    42,
    7,
    {
      "tokens": np.arange(12, dtype=np.int32).reshape(3, 4),
      "logp": np.linspace(-1, 0, 5, dtype=np.float32),
      "done": np.array([False, True]),
    },
    {"task_id": "gsm8k/17", "reward": 1.0},
  )


@pytest.mark.parametrize("dtype", list(R.DTYPE_CODES))
def test_round_trip_every_whitelisted_dtype(dtype):
  rng = np.random.default_rng(0)
  x = (rng.standard_normal((3, 4)) * 100).astype(dtype)
  record = R.decode(R.encode(RecordKind.TRAJECTORY, 1, 2, {"x": x}))
  out = record.arrays["x"]
  assert out.dtype == np.dtype(dtype) and out.shape == x.shape
  np.testing.assert_array_equal(out, x)
  assert out.flags.writeable and out.flags.c_contiguous


def test_zero_d_empty_and_many_arrays():
  arrays = {
    "scalar": np.float64(3.5),
    "int_scalar": np.array(7, dtype=np.int64),
    "empty": np.zeros((0,), np.float32),
    "empty_3d": np.zeros((3, 0, 2), np.int16),
    "nd": np.arange(2 * 3 * 1 * 2, dtype=np.uint8).reshape(2, 3, 1, 2),
  }
  arrays.update({f"step_{i}": np.full((i % 5,), i, np.int32) for i in range(300)})
  record = R.decode(R.encode(RecordKind.TASK, 0, 0, arrays))
  assert list(record.arrays) == list(arrays)
  for name, x in arrays.items():
    assert record.arrays[name].shape == np.shape(x)
    assert record.arrays[name].dtype == np.asarray(x).dtype
    np.testing.assert_array_equal(record.arrays[name], x)


def test_header_fields_meta_and_extreme_ids_round_trip():
  meta = {
    "task_id": 17,
    "reward": np.float32(0.25),
    "timings": {"sample_s": 0.5},
    "turns": [1, 2, 3],
    "note": "héllo ✓",
    "ok": np.bool_(True),
    "none": None,
  }
  for kind in RecordKind:
    data = R.encode(kind, 2**64 - 1, -(2**63), {}, meta)
    record = R.decode(data)
    assert (record.kind, record.record_id, record.policy_version) == (kind, 2**64 - 1, -(2**63))
    assert record.meta == {**meta, "reward": 0.25, "ok": True}
    assert record.arrays == {} and record.nbytes == len(data)
    header = R.peek_header(data)
    assert (header.kind, header.record_id, header.policy_version) == (kind, 2**64 - 1, -(2**63))
    assert header.nbytes == len(data)


def test_big_endian_and_non_contiguous_input_go_on_the_wire_little_endian():
  little = np.arange(24, dtype="<f8").reshape(4, 6)
  big = little.astype(">f8")
  fortran = np.asfortranarray(little)
  assert R.encode(1, 0, 0, {"x": big}) == R.encode(1, 0, 0, {"x": little})
  assert R.encode(1, 0, 0, {"x": fortran}) == R.encode(1, 0, 0, {"x": little})
  out = R.decode(R.encode(1, 0, 0, {"x": big.astype(">i4")[:, ::2]})).arrays["x"]
  np.testing.assert_array_equal(out, little[:, ::2].astype(np.int32))
  assert out.dtype.isnative


def test_decoded_arrays_do_not_alias_the_message_buffer():
  buffer = bytearray(R.encode(1, 0, 0, {"x": np.zeros(8, np.float32)}))
  x = R.decode(memoryview(buffer)).arrays["x"]
  buffer[-4:] = b"\xff" * 4
  x[0] = 1.0
  assert x[1:].tolist() == [0.0] * 7


def test_golden_bytes():
  data = R.encode(
    RecordKind.TRAJECTORY, 0x0102030405060708, -2, {"a": np.array([1, -1], np.int8)}, {"t": 1}
  )
  assert data.hex() == GOLDEN_HEX
  assert len(data) == R.HEADER_SIZE + 26 and R.HEADER_SIZE == 32


def test_int8_arrays_and_their_scales_travel_exactly():
  from sao_jax.compression import quant

  x = np.random.default_rng(1).standard_normal((6, 2, 16)).astype(np.float32)
  q, scale = (np.asarray(a) for a in quant.quantize(x))
  record = R.decode(R.encode(1, 0, 0, {"vec": q, "scale": scale}))
  assert record.arrays["vec"].dtype == np.int8 and record.arrays["scale"].shape == (6, 2)
  np.testing.assert_array_equal(
    quant.dequantize(record.arrays["vec"], record.arrays["scale"]), quant.dequantize(q, scale)
  )


@pytest.mark.parametrize(
  "value",
  [
    np.array(["a", "b"]),
    np.array([b"a"]),
    np.array([1 + 2j]),
    np.array([object()]),
    np.array([1], dtype=np.uint16),
    np.zeros(2, dtype=[("a", np.int32)]),
    np.array(["2020-01-01"], dtype="datetime64[D]"),
    [[1, 2], [3]],
  ],
)
def test_encode_rejects_arrays_it_cannot_carry(value):
  with pytest.raises(R.RecordError, match="'x'"):
    R.encode(1, 0, 0, {"x": value})


@pytest.mark.parametrize(
  "meta",
  [
    {"r": float("nan")},
    {"r": float("inf")},
    {"f": print},
    {"s": {1, 2}},
    {"c": np.complex64(1j)},
    {(1, 2): 3},
    ["not", "a", "mapping"],
  ],
)
def test_encode_rejects_non_json_meta(meta):
  with pytest.raises(R.RecordError, match="meta"):
    R.encode(1, 0, 0, {}, meta)


@pytest.mark.parametrize(
  "kind, record_id, policy_version, arrays",
  [
    (0, 0, 0, {}),
    (9, 0, 0, {}),
    (1, -1, 0, {}),
    (1, 2**64, 0, {}),
    (1, 0, 2**63, {}),
    (1, 1.5, 0, {}),
    (1, 0, 0, {"": np.zeros(1)}),
    (1, 0, 0, {3: np.zeros(1)}),
    (1, 0, 0, {"\ud800": np.zeros(1)}),
    (1, 0, 0, {"x" * 70000: np.zeros(1)}),
  ],
)
def test_encode_rejects_bad_header_fields_and_names(kind, record_id, policy_version, arrays):
  with pytest.raises(R.RecordError):
    R.encode(kind, record_id, policy_version, arrays)


def test_size_limit_on_encode_and_decode():
  arrays = {"x": np.zeros(1000, np.float32)}
  size = len(R.encode(1, 0, 0, arrays))
  with pytest.raises(R.RecordTooLarge, match=rf"\b{size}\b.*\b2000\b") as info:
    R.encode(1, 0, 0, arrays, max_bytes=2000)
  assert (info.value.size, info.value.limit) == (size, 2000)
  with pytest.raises(R.RecordTooLarge, match=r"\b9437235\b.*\b8388608\b"):
    R.encode(1, 0, 0, {"x": np.zeros(9 * 2**20, np.uint8)})
  data = R.encode(1, 0, 0, arrays, max_bytes=size)
  with pytest.raises(R.RecordTooLarge):
    R.decode(data, max_bytes=size - 1)
  with pytest.raises(R.RecordTooLarge):
    R.peek_header(data, max_bytes=size - 1)
  # A header alone claiming 4 GiB is refused before anything is read or allocated.
  with pytest.raises(R.RecordTooLarge):
    R.decode(_seal(b"", length=2**32 - 1))


def test_corruption_anywhere_fails_the_checksum():
  data = _sample_record()
  for offset in [6, 7, 8, 16, 20, 28, 33, 40, len(data) // 2, len(data) - 1]:
    corrupt = bytearray(data)
    corrupt[offset] ^= 0x10
    with pytest.raises(R.ChecksumMismatch, match="CRC32C"):
      R.decode(bytes(corrupt))


def test_bad_magic_and_foreign_schema():
  data = _sample_record()
  with pytest.raises(R.BadMagic):
    R.decode(b"SAOX" + data[4:])
  with pytest.raises(R.BadMagic):
    R.decode(b"\x80\x04\x95" + data)  # a pickle is not a record
  with pytest.raises(R.SchemaMismatch, match="version 2"):
    R.decode(data[:4] + struct.pack("<H", 2) + data[6:])
  with pytest.raises(R.SchemaMismatch):
    R.peek_header(_seal(b"", version=0))


def test_truncation_and_overlong_length_field():
  data = _sample_record()
  for end in [0, 2, 4, 10, 31, 32, 36, len(data) // 2, len(data) - 1]:
    with pytest.raises(R.Truncated):
      R.decode(data[:end])
  longer = bytearray(data)
  struct.pack_into("<I", longer, 24, len(data))
  with pytest.raises(R.Truncated, match="only"):
    R.decode(bytes(longer))
  with pytest.raises(R.Malformed, match="follow"):
    R.decode(data + b"\x00")


def test_hand_made_payloads_with_valid_checksums():
  cases = {
    # Arrays that claim far more data than the payload has must not be allocated.
    R.Truncated: [
      _payload(b"{}", _array(b"x", 9, (2**32 - 1,) * 3)),
      _payload(b"{}", _array(b"x", 8, (2**20, 2**20), b"\x00" * 64)),
      _payload(b"{}", _array(b"x", 1, (5,), b"\x01" * 4)),
      _payload(b"{}", count=2**32 - 1),
      struct.pack("<I", 2**32 - 1) + b"{}",
      _payload(b"{}", _array(b"x", 1, (5,))[:-2]),
    ],
    R.Malformed: [
      _payload(b"{}", _array(b"x", 9, (0,) + (2**32 - 1,) * 3)),
      _payload(b"{}", _array(b"x", 0, (1,), b"\x00")),
      _payload(b"{}", _array(b"x", 10, (1,), b"\x00")),
      _payload(b"{}", _array(b"x", 3, (1,) * 33, b"\x00")),
      _payload(b"{}", _array(b"", 3, (1,), b"\x00")),
      _payload(b"{}", _array(b"\xff\xfe", 3, (1,), b"\x00")),
      _payload(b"{}", _array(b"x", 3, (1,), b"\x00"), _array(b"x", 3, (1,), b"\x00")),
      _payload(b"{}", _array(b"x", 3, (1,), b"\x00")) + b"\x00",
      _payload(b"[1, 2]"),
      _payload(b'{"r": NaN}'),
      _payload(b"{"),
      _payload(b'{"a": "\xff"}'),
      _payload(b"[" * 100_000),
      _payload(b"1" * 5000),
    ],
  }
  for error, payloads in cases.items():
    for payload in payloads:
      with pytest.raises(error):
        R.decode(_seal(payload))
  ok = R.decode(_seal(_payload(b"{}", _array(b"x", 1, (3,), b"\x00\x01\x07"))))
  assert ok.arrays["x"].tolist() == [False, True, True]


@pytest.mark.parametrize("fields", [{"kind": 0}, {"kind": max(RecordKind) + 1}, {"flags": 1}])
def test_unknown_kind_or_flags(fields):
  data = _seal(_payload(), **fields)
  with pytest.raises(R.Malformed):
    R.decode(data)
  with pytest.raises(R.Malformed):
    R.peek_header(data)


def test_decode_rejects_non_bytes_with_type_error():
  with pytest.raises(TypeError):
    R.decode("SAOR")  # type: ignore[arg-type]


def _mutate(rng: random.Random, data: bytes, other: bytes) -> bytes:
  choice = rng.randrange(6)
  if choice == 0:  # bit flips
    out = bytearray(data)
    for _ in range(rng.randint(1, 3)):
      out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    return bytes(out)
  if choice == 1:  # truncation
    return data[: rng.randrange(len(data))]
  if choice == 2:  # splice with another record
    return data[: rng.randrange(len(data))] + other[rng.randrange(len(other)) :]
  if choice == 3:  # random bytes inserted
    at = rng.randrange(len(data))
    return data[:at] + rng.randbytes(rng.randint(1, 8)) + data[at:]
  if choice == 4:  # a range deleted
    at = rng.randrange(len(data))
    return data[:at] + data[at + rng.randint(1, 16) :]
  out = bytearray(data)  # a little-endian integer field overwritten with an extreme value
  at = rng.randrange(R.HEADER_SIZE, len(out) - 4)
  out[at : at + 4] = rng.choice([b"\xff\xff\xff\xff", b"\x00\x00\x00\x00", b"\xff\xff\xff\x7f"])
  return bytes(out)


def test_fuzz_only_record_errors():
  rng = random.Random(1234)
  seeds = [
    _sample_record(),
    R.encode(
      RecordKind.PARAMS,
      1,
      1,
      {"w": np.ones((4, 4), np.float16), "b": np.zeros((), np.int64), "e": np.zeros((0, 3))},
    ),
    R.encode(RecordKind.CONTROL, 9, -1, {}, {"op": "stop", "nested": {"a": [1, 2.5, None]}}),
  ]
  inputs = []
  for i in range(3000):
    junk = rng.randbytes(rng.randint(0, 120))
    inputs.append(
      [
        junk,
        R.MAGIC + b"\x01\x00" + junk,
        _seal(junk),
        _seal(_payload(b"{}", count=rng.randint(1, 4)) + junk),
      ][i % 4]
    )
  for i in range(3000):
    mutated = _mutate(rng, rng.choice(seeds), rng.choice(seeds))
    inputs.append(_reseal(mutated, fix_length=i % 3 != 0) if i % 2 else mutated)
  outcomes: dict[str, int] = {}
  for data in inputs:
    for parse in (R.decode, R.peek_header):
      try:
        parse(data)
        outcome = "ok"
      except R.RecordError as e:
        outcome = type(e).__name__
      outcomes[outcome] = outcomes.get(outcome, 0) + 1
  # The fuzz must reach every check, including the payload parser behind a valid checksum.
  assert set(outcomes) == {
    "ok",
    "BadMagic",
    "SchemaMismatch",
    "Truncated",
    "ChecksumMismatch",
    "Malformed",
    "RecordTooLarge",
  }, outcomes


def test_trajectory_meta_counts_are_checked_before_the_learner_sums_them():
  from sao_jax.buffer import check_trajectory

  arrays = {
    "prompt": np.zeros((1, 4), np.int32),
    "prompt_valid": np.ones((1, 4), bool),
    "tokens": np.zeros((1, 3), np.int32),
    "valid": np.ones((1, 3), bool),
    "logp": np.zeros((1, 3), np.float32),
    "rewards": np.zeros(1, np.float32),
  }
  meta = {"reward": 1.0, "t_end": 0.0, "task_index": 0, "reward_s": 0.01}
  for runs, ok in ((None, True), (3, True), (-1, False), (True, False), ("2", False)):
    m = meta if runs is None else dict(meta, sandbox_runs=runs)
    rec = R.decode(R.encode(RecordKind.TRAJECTORY, 1, 0, arrays, m))
    if ok:
      check_trajectory(rec, (4, 3), num_tasks=1, max_rows=1)
    else:
      with pytest.raises(R.Malformed, match="sandbox_runs"):
        check_trajectory(rec, (4, 3), num_tasks=1, max_rows=1)
