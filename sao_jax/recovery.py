"""What a crashed SAO learner needs to resume without losing or re-applying a trajectory.

- `Journal`: an append-only log, in the learner's workdir, of every trajectory record the
  learner took off the transport, in the order it took them (sequence numbers 0, 1, ...).
  A snapshot stores `journal_next`, the sequence number of the first record not yet applied
  to (or dropped by) the snapshotted state. After a crash, the records from `journal_next`
  on are replayed in the same order, so the resumed learner forms the same batches and,
  on CPU, reaches bit-identical states for the replayed updates. Entries are framed
  (length + CRC32) and written through to the OS before they are used, so they survive a
  kill -9 of the learner (fsync at each snapshot covers a machine crash up to that point).
  Segments start at each snapshot and are deleted once no kept snapshot needs them.
- `Ledger`: one JSON line per update with the record ids it applied and the ones it dropped
  as too stale. After a resume it is cut back to the snapshot's step, so it always
  describes the lineage of the current state: the accounting behind "nothing lost, nothing
  applied twice", and the id set that drops redelivered duplicates.
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import struct
import time
import warnings
import zlib
from collections.abc import Iterator

_FRAME = struct.Struct("<II")  # payload length, crc32(payload)


class Journal:
  def __init__(self, directory: str | pathlib.Path, *, readonly: bool = False):
    """`readonly`: only read (`sao-jax replay`, audits): no directory made, nothing cut."""
    self.dir = pathlib.Path(directory)
    if not readonly:
      self.dir.mkdir(parents=True, exist_ok=True)
    self._file = None
    self.next_seq = 0
    self.truncated_tail = 0  # bytes of a half-written last entry dropped when opening
    segs = self.segments() if self.dir.is_dir() else []
    if segs:
      last_first, last_path = segs[-1]
      n, good_bytes = self._scan(last_path)
      size = last_path.stat().st_size
      if good_bytes < size and not readonly:  # a crash mid-write: never used, drop its bytes
        self.truncated_tail = size - good_bytes
        with open(last_path, "r+b") as f:
          f.truncate(good_bytes)
      self.next_seq = last_first + n

  def segments(self) -> list[tuple[int, pathlib.Path]]:
    return sorted((int(p.stem), p) for p in self.dir.glob("*.log") if p.stem.isdigit())

  @staticmethod
  def _scan(path: pathlib.Path) -> tuple[int, int]:
    """(entries, bytes) of the valid prefix of a segment."""
    n = good = 0
    with open(path, "rb") as f:
      while True:
        head = f.read(_FRAME.size)
        if len(head) < _FRAME.size:
          return n, good
        length, crc = _FRAME.unpack(head)
        data = f.read(length)
        if len(data) < length or zlib.crc32(data) != crc:
          return n, good
        n += 1
        good += _FRAME.size + length

  def rotate(self) -> None:
    """Starts a new segment at `next_seq` (called at each snapshot) and syncs the old one."""
    if self._file is not None:
      self._file.flush()
      os.fsync(self._file.fileno())
      self._file.close()
      self._file = None

  def append(self, records: list[bytes]) -> int:
    """Appends and writes through to the OS; returns the first sequence number used."""
    first = self.next_seq
    if not records:
      return first
    if self._file is None:
      self._file = open(self.dir / f"{self.next_seq:012d}.log", "ab")
    self._file.write(b"".join(_FRAME.pack(len(r), zlib.crc32(r)) + r for r in records))
    self._file.flush()
    self.next_seq += len(records)
    return first

  def read_from(self, seq: int) -> Iterator[tuple[int, bytes]]:
    """Entries with sequence number >= seq, in order."""
    segs = self.segments()
    for i, (first, path) in enumerate(segs):
      end = segs[i + 1][0] if i + 1 < len(segs) else None
      if end is not None and end <= seq:
        continue
      with open(path, "rb") as f:
        n = first
        while True:
          head = f.read(_FRAME.size)
          if len(head) < _FRAME.size:
            break
          length, crc = _FRAME.unpack(head)
          data = f.read(length)
          if len(data) < length or zlib.crc32(data) != crc:
            break
          if n >= seq:
            yield n, data
          n += 1

  def first_available(self) -> int:
    segs = self.segments()
    return segs[0][0] if segs else self.next_seq

  def prune(self, keep_from: int) -> None:
    """Deletes segments whose every entry is < keep_from."""
    segs = self.segments()
    for i, (_first, path) in enumerate(segs[:-1]):
      if segs[i + 1][0] <= keep_from:
        path.unlink(missing_ok=True)

  def close(self) -> None:
    self.rotate()


class Ledger:
  """`ledger.jsonl`: {"step": k, "applied": [ids], "stale": [ids]} per update ("stale": every
  record dropped, too stale or of a discarded lineage); the SAO learner also writes
  "lineage" (the policy lineage the update extended, hex; `sao_jax.lineage`) and
  "discarded" (the dropped ones of a discarded lineage) and, with
  `sao.discarded_lineage="weight"`, "weighted" (the applied ones of a discarded lineage,
  trained on at their distance along the lineage tree). With the journal kept
  (`recovery.keep_journal`), also "check": the update's exact loss, gradient norm and
  parameter digest, which `sao-jax replay` re-derives step by step."""

  def __init__(self, path: str | pathlib.Path):
    self.path = pathlib.Path(path)
    self._file = None

  def rows(self) -> list[dict]:
    if not self.path.exists():
      return []
    out = []
    with open(self.path) as f:
      for line in f:
        try:
          out.append(json.loads(line))
        except json.JSONDecodeError:
          continue  # a half-written last line from a crash
    return out

  def cut_to(self, step: int) -> set[int]:
    """Keeps the rows of updates <= step (the restored lineage); returns their record ids."""
    keep = [r for r in self.rows() if r["step"] <= step]
    dropped = len(self.rows()) - len(keep)
    tmp = self.path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in keep))
    os.replace(tmp, self.path)
    if dropped:
      warnings.warn(
        f"ledger: {dropped} updates after step {step} were lost in the crash and "
        "will be redone from the journal",
        RuntimeWarning,
        stacklevel=2,
      )
    return {i for r in keep for i in r["applied"] + r["stale"]}

  def append(
    self,
    step: int,
    applied: list[int],
    stale: list[int],
    check: dict | None = None,
    lineage: str | None = None,
    discarded: list[int] | None = None,
    weighted: list[int] | None = None,
  ) -> None:
    if self._file is None:
      self._file = open(self.path, "a", buffering=1)
    row = {"step": step, "applied": applied, "stale": stale}
    if lineage is not None:
      row["lineage"], row["discarded"] = lineage, discarded or []
    if weighted:
      row["weighted"] = weighted
    if check is not None:
      row["check"] = check
    self._file.write(json.dumps(row) + "\n")

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
      self._file = None


class EventLog:
  """`events.jsonl`: what happened to a run, across every process that ran it, never cut back.

  Snapshots carry the counters of the restored lineage only: what an incarnation did after
  its last snapshot (a sampler restart, a rollback, rejected records) is gone with it, and
  updates redone after a resume would be counted twice. So each incarnation (one learner
  process's phase) appends here: "start" (resumed or not, from which step), its counters as
  deltas since its own start ("counts", at every log step and at its end: a crash loses at
  most one log interval), "resume" (restart -> first update, with the breakdown), "rollback",
  "transient" (the first updates of each new policy lineage: staleness, off-policy deviation
  and drops, rewritten as they go) and "finish". `lifetime()` adds them up.
  """

  def __init__(self, path: str | pathlib.Path, phase: str):
    import uuid

    self.path, self.phase = pathlib.Path(path), phase
    self.incarnation = uuid.uuid4().hex[:8]
    self._file = open(self.path, "a", buffering=1)

  def write(self, event: str, **fields) -> None:
    row = {
      "t": round(time.time(), 3),
      "phase": self.phase,
      "incarnation": self.incarnation,
      "pid": os.getpid(),
      "event": event,
      **fields,
    }
    self._file.write(json.dumps(row, default=float) + "\n")

  def close(self) -> None:
    if not self._file.closed:
      self._file.close()

  @staticmethod
  def rows(path: str | pathlib.Path) -> list[dict]:
    return Ledger(path).rows()  # (a half-written last line is skipped)

  @staticmethod
  def lifetime(path: str | pathlib.Path, phase: str) -> dict:
    """Totals over every incarnation of `phase`: incarnations, how many ended without a
    "finish" (killed), resumes and their recovery times, rollbacks, and the sum of each
    incarnation's last counter deltas."""
    rows = [r for r in EventLog.rows(path) if r.get("phase") == phase]
    incs: dict[str, dict] = {}
    for r in rows:
      inc = incs.setdefault(r["incarnation"], {"counts": {}, "finished": False})
      if r["event"] == "counts":
        inc["counts"] = r["counts"]
      elif r["event"] == "finish":
        inc["finished"] = True
        inc["counts"] = r.get("counts", inc["counts"])
    totals: dict[str, int] = collections.Counter()
    for inc in incs.values():
      totals.update(inc["counts"])
    recovery = [r["recovery_s"] for r in rows if r["event"] == "resume" and "recovery_s" in r]
    transients: dict[tuple, dict] = {}  # the newest row of each (incarnation, lineage)
    for r in rows:
      if r["event"] == "transient":
        keep = ("event", "incarnation", "phase", "pid", "t")
        transients[(r["incarnation"], r.get("lineage"))] = {
          k: v for k, v in r.items() if k not in keep
        }
    return {
      "incarnations": len(incs),
      "killed": sum(not inc["finished"] for inc in incs.values()),
      "resumes": sum(1 for r in rows if r["event"] == "start" and r.get("resumed")),
      "recovery_s": recovery,
      "rollbacks": sum(1 for r in rows if r["event"] == "rollback"),
      "counts": dict(totals),
      "transients": list(transients.values()),
    }


def audit(workdir: str | pathlib.Path, journal_next: int) -> dict:
  """Checks a finished SAO run's accounting (needs `recovery.keep_journal=True` so that no
  journal segment was pruned): every record the learner consumed before `journal_next`
  (the final snapshot's) was applied or dropped as stale exactly once in the final lineage,
  none appears twice, and no applied record is of a policy off the path of the lineage its
  update extended (`sao_jax.lineage`) unless its ledger row says it was weighed at its
  distance (`sao.discarded_lineage="weight"`). Returns counts; `lost`, `applied_twice` and
  `discarded_lineage_applied` must be 0."""
  from sao_jax.transport import records

  workdir = pathlib.Path(workdir)
  journal = Journal(workdir / "journal", readonly=True)
  if journal.first_available() != 0:
    raise ValueError("journal segments were pruned; run with recovery.keep_journal=True")
  consumed, unused, recs = [], 0, {}
  for seq, data in journal.read_from(0):
    if seq < journal_next:
      rec = records.decode(data)
      consumed.append(rec.record_id)
      recs[rec.record_id] = rec
    else:
      unused += 1
  rows = Ledger(workdir / "ledger.jsonl").rows()
  # Each applied record's policy must be an ancestor of the one its update extended (at
  # version step - 1 of the row's lineage): none of a discarded lineage trains as current.
  from sao_jax.buffer import on_path
  from sao_jax.lineage import LineageLog, LineageTree

  tree = LineageTree(LineageLog(workdir / "lineages.jsonl").nodes())
  off_path = 0
  for r in rows:
    if r.get("lineage") is None:
      continue
    tree.current = int(r["lineage"], 16)
    if tree.current not in tree.nodes:
      off_path += len(r["applied"])  # a lineage the log never had: nothing is its ancestor
      continue
    weighed = set(r.get("weighted", []))  # trained on at their distance, by the config
    off_path += sum(
      not on_path(recs[i], r["step"] - 1, tree)
      for i in r["applied"]
      if i in recs and i not in weighed
    )
  used = [i for r in rows for i in r["applied"] + r["stale"]]
  steps = [r["step"] for r in rows]
  used_set = set(used)
  return {
    "consumed": len(consumed),
    "applied": sum(len(r["applied"]) for r in rows),
    "stale": sum(len(r["stale"]) for r in rows),
    "unused_at_end": unused,
    "applied_twice": len(used) - len(used_set),
    "lost": len(set(consumed) - used_set),
    "not_consumed": len(used_set - set(consumed)),
    "steps_contiguous": steps == list(range(1, len(steps) + 1)),
    "discarded_lineage_applied": off_path,
    "discarded_lineage_dropped": sum(len(r.get("discarded", [])) for r in rows),
    "discarded_lineage_weighted": sum(len(r.get("weighted", [])) for r in rows),
  }
