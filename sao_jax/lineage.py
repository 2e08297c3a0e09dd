"""Policy identity: (lineage, version), not a version number alone.

The learner publishes policy versions 0, 1, 2, ... A resume from a snapshot at step b goes on
from b, and a rollback to a shadow model replaces the parameters without changing the step:
either way the numbers after the branch point are published again by a *different* history of
updates, while samplers, the transport and the journal still hold work of the history that
was discarded. So every start of the learner, every resume and every rollback begins a new
lineage (a random 48-bit id, unique without coordination between incarnations), and a policy
is named by the pair.

The lineages of a run form a tree: each one names its parent and the version in the parent
whose parameters it started from (`origin`), and the version it first published (`start`):
a resume at b starts at b from the parent's b; a rollback at step s to a shadow of step o
starts at s from the parent's o. The policy (L, v) is an *ancestor* of the current one
(C, step) when walking up from C reaches L with start(L) <= v <= the version at which the walk
left L; its distance in updates is then the number of updates on that path
(`LineageTree.age`). Anything else is of a discarded lineage (a branch that a resume or a
rollback left) or of a lineage this run never had. The learner drops both, counted
(`sao_jax.runners.sao`); with `sao.discarded_lineage="weight"` it trains on a discarded
lineage's records instead, each at its true distance from the current policy
(`LineageTree.distance`: up the discarded branch to where it meets the current path, then
down the path), weighted and importance-corrected like any record of that age.

The tree is small (one node per start, resume or rollback): it is saved in every snapshot's
stream metadata and also appended to `lineages.jsonl` in the workdir as each lineage begins,
so that a restarted learner knows the lineages of the incarnations that died after its
snapshot (their records are *discarded*, not *unknown*).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import time

import numpy as np

NO_LINEAGE = -1  # a record without a lineage: never an ancestor


def new_id() -> int:
  """A fresh lineage id: 48 random bits (exact as a JSON number in any reader)."""
  return int.from_bytes(os.urandom(6), "little")


@dataclasses.dataclass(frozen=True)
class Node:
  """One lineage: its id, the first version it published, its parent lineage and the parent's
  version it started from (None for the root), why it began, and when (Unix time)."""

  id: int
  start: int
  parent: int | None = None
  origin: int | None = None
  why: str = "start"  # "start" | "resume" | "rollback"
  t: float = 0.0

  def to_json(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_json(cls, d: dict) -> Node:
    return cls(
      id=int(d["id"]),
      start=int(d["start"]),
      parent=None if d.get("parent") is None else int(d["parent"]),
      origin=None if d.get("origin") is None else int(d["origin"]),
      why=str(d.get("why", "start")),
      t=float(d.get("t", 0.0)),
    )


class LineageTree:
  """Every lineage of a run and which one is current (module docstring)."""

  def __init__(
    self,
    nodes: list[Node] | None = None,
    current: int | None = None,
    weigh_discarded: bool = False,
  ):
    self.nodes: dict[int, Node] = {n.id: n for n in nodes or []}
    self.current = current
    # How the learner measures a record of a discarded lineage (`measure`): not at all (-1:
    # dropped) or by its distance along the tree (`sao.discarded_lineage`).
    self.weigh_discarded = weigh_discarded
    if current is not None and current not in self.nodes:
      raise ValueError(f"current lineage {current:x} is not in the tree")

  def begin(self, start: int, why: str, origin: int | None = None, _id: int | None = None) -> Node:
    """A new current lineage that publishes from version `start` on, starting from the
    current lineage's version `origin` (default `start`; a rollback names the shadow's), or a
    root when there is no current lineage."""
    lid = new_id() if _id is None else _id
    while lid in self.nodes or lid == NO_LINEAGE:
      lid = new_id()
    parent = self.current
    node = Node(
      id=lid,
      start=start,
      parent=parent,
      origin=None if parent is None else (start if origin is None else origin),
      why=why,
      t=time.time(),
    )
    self.nodes[lid] = node
    self.current = lid
    return node

  def branch_from(self, parent: int, origin: int, start: int, why: str) -> Node:
    """A new current lineage starting from `parent`'s version `origin` (e.g. a shadow model
    saved under another lineage than the current one)."""
    if parent not in self.nodes:
      raise ValueError(f"lineage {parent:x} is not in the tree")
    self.current = parent
    return self.begin(start, why, origin=origin)

  def path(self) -> list[tuple[Node, int]]:
    """The current lineage and its ancestors, newest first, each with the last version of it
    on the path (None for the current one: its newest)."""
    out, node, upto = [], self.nodes.get(self.current), None
    seen = set()
    while node is not None and node.id not in seen:
      seen.add(node.id)
      out.append((node, upto))
      upto = node.origin
      node = self.nodes.get(node.parent) if node.parent is not None else None
    return out

  def age(self, lineage: int, versions, step: int):
    """Updates between the policy (lineage, v) and the current policy at version `step`, for
    each v in `versions` (an int or an int array); -1 where (lineage, v) is not an ancestor
    of the current policy (a discarded lineage, an unknown one, or a version the lineage
    never had on this path)."""
    v = np.asarray(versions, np.int64)
    out = np.full(v.shape, -1, np.int64)
    dist = 0
    for node, last in self.path():
      hi = step if last is None else last
      if node.id == lineage:
        out = np.where((v >= node.start) & (v <= hi), dist + (hi - v), out)
        break
      dist += hi - node.start
    return int(out) if np.ndim(versions) == 0 else out

  def distance(self, lineage: int, versions, step: int):
    """Updates between the policy (lineage, v) and the current policy at version `step` along
    the tree, for each v in `versions`: up from (lineage, v) to the nearest policy on the
    current path (the branch point), then down the path to the current one. The same as
    `age` for an ancestor; for a policy of a discarded branch the sum of both legs (a record
    of the lineage a resume at b left, at version b + 3, while the learner is at b + 2, is 5
    updates away). -1 for a lineage the tree does not know or a version it never had."""
    on_path = {node.id: (node.start, step if last is None else last) for node, last in self.path()}
    v = np.asarray(versions, np.int64)
    out = np.full(v.shape, -1, np.int64)
    for u0 in np.unique(v):
      node, u, up, seen = self.nodes.get(lineage), int(u0), 0, set()
      if node is None or u < node.start:
        continue
      while node is not None and node.id not in seen:
        seen.add(node.id)
        if node.id in on_path:
          start, hi = on_path[node.id]
          meet = min(u, hi)  # (a version of the current lineage ahead of `step`: none yet)
          if meet >= start and not (u > hi and node.id == self.current):
            out[v == u0] = up + (u - meet) + int(self.age(node.id, meet, step))
          break
        if node.parent is None:
          break
        up += u - node.start
        u, node = node.origin, self.nodes.get(node.parent)
    return int(out) if np.ndim(versions) == 0 else out

  def measure(self, lineage: int, versions, step: int):
    """The learner's staleness of (lineage, v): `age` (-1 off the current path: dropped), or
    `distance` when discarded lineages are weighed (`weigh_discarded`)."""
    return (self.distance if self.weigh_discarded else self.age)(lineage, versions, step)

  def holds(self, lineage: int, versions, step: int) -> bool:
    """Whether every version in `versions` of `lineage` is an ancestor of the current policy.
    A lineage's versions on the current path form an interval, so the smallest and largest
    decide for all (the buffer asks for every record on every fill pass: two ages, not one
    per token)."""
    v = np.asarray(versions)
    return not v.size or bool(np.all(self.age(lineage, np.array([v.min(), v.max()]), step) >= 0))

  def known(self, lineage: int) -> bool:
    return lineage in self.nodes

  # Persistence ---------------------------------------------------------------------------------
  def to_json(self) -> dict:
    return {"current": self.current, "nodes": [n.to_json() for n in self.nodes.values()]}

  @classmethod
  def from_json(cls, d: dict | None) -> LineageTree:
    if not d:
      return cls()
    return cls([Node.from_json(n) for n in d.get("nodes", [])], d.get("current"))

  def restore(self, other: LineageTree) -> None:
    """Becomes `other`'s lineages (in place: holders of this tree see the change; how it
    measures discarded ones stays)."""
    self.nodes, self.current = dict(other.nodes), other.current

  def merge(self, nodes: list[Node]) -> None:
    """Adds lineages known from elsewhere (the workdir's log), keeping the current one."""
    for n in nodes:
      self.nodes.setdefault(n.id, n)


class LineageLog:
  """`lineages.jsonl`: one line per lineage as it begins (append-only, flushed). A restarted
  learner reads it to know the lineages that died after its snapshot."""

  def __init__(self, path: str | pathlib.Path):
    self.path = pathlib.Path(path)

  def append(self, node: Node) -> None:
    with open(self.path, "a") as f:
      f.write(json.dumps(node.to_json()) + "\n")
      f.flush()
      os.fsync(f.fileno())

  def nodes(self) -> list[Node]:
    if not self.path.exists():
      return []
    out = []
    for line in self.path.read_text().splitlines():
      try:
        out.append(Node.from_json(json.loads(line)))
      except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        continue  # a half-written last line from a crash
    return out
