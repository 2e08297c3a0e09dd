"""Every committed result JSON says where it came from: a command and a git commit, either in
a `provenance` block (`sao_jax.provenance`; `commit_added` where it was backfilled after the
run) or as `command` and `commit`/`git_commit` keys anywhere inside, as older scripts write."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import REPO_ROOT

# Tracked JSONs that are not results themselves, each with the tracked result beside it that
# records the command and commit of the run that wrote it.
EXEMPT = {
  # The sweep's resolved definition, which `sao-jax sweep` compares key by key on a rerun
  # into the same directory (an added key would read as a different sweep); copied from the
  # sweep directory by experiments/sweep_resume_demo.py.
  "results/sweep_resume_demo/sweep.json": "results/sweep_resume_demo/demo.json",
  # The sweep's own table, copied verbatim from the sweep directory by the same script (a
  # rerun of it overwrites this file).
  "results/sweep_resume_demo/trials.json": "results/sweep_resume_demo/demo.json",
}
COMMIT_KEYS = ("commit", "git_commit")


def _values(doc, key: str):
  """Every value stored under `key` at any depth of a JSON document."""
  if isinstance(doc, dict):
    for k, v in doc.items():
      if k == key:
        yield v
      yield from _values(v, key)
  elif isinstance(doc, list):
    for v in doc:
      yield from _values(v, key)


def _has(doc, *keys: str) -> bool:
  return any(isinstance(v, str) and v.strip() for k in keys for v in _values(doc, k))


def missing_provenance(doc) -> list[str]:
  """What `doc` lacks of a command and a commit ([] when it has both)."""
  block = doc.get("provenance") if isinstance(doc, dict) else None
  if isinstance(block, dict) and _has(block, "command"):
    if _has(block, *COMMIT_KEYS, "commit_added"):
      return []
  missing = [] if _has(doc, "command") else ["command"]
  return missing + ([] if _has(doc, *COMMIT_KEYS) else ["commit"])


def tracked_result_jsons() -> list[str]:
  try:
    out = subprocess.run(
      ["git", "ls-files", "--", "results"],
      cwd=REPO_ROOT,
      capture_output=True,
      text=True,
      timeout=30,
    )
  except (OSError, subprocess.TimeoutExpired) as e:
    pytest.skip(f"git is not usable here: {e}")
  if out.returncode != 0:
    pytest.skip(f"not a git checkout: {out.stderr.strip()}")
  return sorted(f for f in out.stdout.splitlines() if f.endswith(".json"))


def _problem(rel: str) -> str | None:
  try:
    doc = json.loads((REPO_ROOT / rel).read_text())
  except (OSError, ValueError) as e:
    return f"{rel}: unreadable ({e})"
  missing = missing_provenance(doc)
  return f"{rel}: no {' and no '.join(missing)}" if missing else None


def test_every_committed_result_records_command_and_commit():
  files = tracked_result_jsons()
  if not files:
    pytest.skip("no committed results in this checkout")
  problems = [p for f in files if f not in EXEMPT for p in [_problem(f)] if p]
  assert not problems, (
    "committed results without provenance (write `provenance(...)` from "
    "sao_jax.provenance into them, or backfill a block marked backfilled):\n  "
    + "\n  ".join(problems)
  )


def test_exemptions_are_tracked_and_covered():
  files = set(tracked_result_jsons())
  stale = sorted(set(EXEMPT) - files)
  assert not stale, f"exempt but no longer tracked, drop them from EXEMPT: {stale}"
  uncovered = [
    f"{f} -> {cover}"
    for f, cover in EXEMPT.items()
    if cover not in files or _problem(cover) is not None
  ]
  assert not uncovered, f"exempt files whose covering result lacks provenance: {uncovered}"


def test_the_check_tells_a_bare_result_from_a_recorded_one():
  bare = {"machine": {"cpus": 2}, "accuracy": 0.5}
  assert missing_provenance(bare) == ["command", "commit"]
  assert missing_provenance({"command": "python x.py", "accuracy": 0.5}) == ["commit"]
  assert missing_provenance({"provenance": {"command": "python x.py", "commit": ""}}) == ["commit"]
  recorded = {"provenance": {"command": "python x.py", "commit": "abc123"}, **bare}
  backfilled = {"provenance": {"backfilled": True, "command": "python x.py", "commit_added": "a"}}
  nested = {"runs": [{"command": "python x.py", "git_commit": "abc123"}]}
  assert missing_provenance(recorded) == missing_provenance(backfilled) == []
  assert missing_provenance(nested) == []
  # commit_added counts only inside a provenance block, where it is marked as backfilled
  assert missing_provenance({"command": "python x.py", "commit_added": "a"}) == ["commit"]
