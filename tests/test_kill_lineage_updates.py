"""experiments/kill_lineage_updates.py: which updates a killed run kept, and the seconds its
restarts cost, read from a metrics file written by several incarnations."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def ku(experiment):
  return experiment("kill_lineage_updates")


def _rows(incarnation: str, steps, t0: float, startup: float):
  """Update rows of one incarnation: 1 s an update after a `startup` from clock `t0`."""
  return [
    {
      "phase": "rl",
      "step": s,
      "loss": 0.0,
      "train_seconds": t0 + startup + i,
      "accuracy": a,
      "incarnation": incarnation,
    }
    for i, (s, a) in enumerate(steps)
  ]


def test_kept_rows_follow_the_last_incarnation_and_end_at_the_final_step(ku, tmp_path):
  # A: steps 1-6 (snapshot at 4), killed; B resumes at 4: steps 5-8, killed before a snapshot;
  # C resumes at 4 again and ends at step 6 (its clock ran out).
  a = _rows("A", [(s, 0.1) for s in range(1, 7)], 0.0, 8.0)
  b = _rows("B", [(s, 0.5) for s in range(5, 9)], 11.0, 8.0)  # (clock back at step 4's: 11)
  c = _rows("C", [(s, 0.9) for s in range(5, 7)], 11.0, 8.0)
  with open(tmp_path / "metrics.jsonl", "w") as f:
    for r in [{"phase": "sft", "step": 1}, *a, *b, *c]:
      f.write(json.dumps(r) + "\n")
  kept = ku.kept_rows(tmp_path, final_step=6)
  assert [r["step"] for r in kept] == [1, 2, 3, 4, 5, 6]
  assert [r["accuracy"] for r in kept] == [0.1] * 4 + [0.9] * 2  # B's steps 5-8 discarded
  # Two starts in the kept lineage (A's at step 1, C's at step 5), 8 s each, a 1 s update:
  # 7 s beyond an update each.
  assert ku.startup_seconds(kept) == pytest.approx(14.0)
  got = ku.arm_numbers(kept, range(5, 7))
  assert got["kept_updates"] == 6 and got["train_seconds"] == pytest.approx(20.0)
  assert got["batch_accuracy_same_steps"] == pytest.approx(0.9)


def test_workdir_of_reads_the_result_files_command(ku, tmp_path):
  doc = {
    "provenance": {"command": "python k.py --out results/kill_lineage/fit --workdir /w/runs"},
    "sft_steps": 300,
    "seed": 2,
  }
  assert str(ku.workdir_of(doc, "killed", tmp_path)) == "/w/runs/fit/sft300_seed2/killed/run"
  doc["provenance"]["command"] = "python k.py --out results/kill_lineage/fit"
  want = tmp_path / "runs/kill_lineage/fit/sft300_seed2/uninterrupted/run"
  assert ku.workdir_of(doc, "uninterrupted", tmp_path) == want
