"""experiments/bench_memory_update.py --quick: the compressed arm in both modes, the same first
loss; the sampler's cached memory plays the same tokens; --task and --arms refuse unknowns."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import subprocess_env

_SMALL = ("--set", "model.depth=1", "--set", "compression.enc_depth=1")


@pytest.mark.slow
def test_bench_memory_update_quick(tmp_path, repo_root, capsys):
  out = tmp_path / "x.json"
  cmd = [sys.executable, str(repo_root / "experiments" / "bench_memory_update.py"), "--quick"]
  proc = subprocess.run(
    # --set as for sao-jax train (here the tiny variant's own depths): recorded in the JSON.
    # The compressed arm only: its shared mode shares the salience pass, which only this
    # checks; the control's shared bank is checked against per-row memories (log-probs and
    # gradients) in test_compression_memory, and compiling its two updates here took ~45 s.
    [*cmd, *_SMALL, "--arms", "compressed", "--out", str(out)],
    cwd=repo_root,
    capture_output=True,
    text=True,
    timeout=600,
    env=subprocess_env(),
  )
  assert proc.returncode == 0, proc.stderr
  r = json.loads(out.read_text())
  assert r["provenance"]["commit"] and r["task"] == "retention" and r["repeats"] == 2
  assert r["overrides"] == list(_SMALL[1::2])
  arms = r["arms"]
  # The compressed arm evicts: its bank is never shared (its salience pass is, in "shared").
  assert list(arms) == ["compressed"] and not arms["compressed"]["shares_bank"]
  for name, a in arms.items():
    # The two modes compute the same function: the same first update from the same state.
    assert a["first_update_loss_rel_diff"] < 1e-5, name
    for mode in ("per_row", "shared"):
      assert a[mode]["n"] == 2 and all(t > 0 for t in a[mode]["values"]), (name, mode)
    assert a["speedup"]["n"] == 2 and a["speedup"]["mean"] > 0
  # The sampler with the memory's keys and values cached plays the same greedy tokens.
  smp = r["sampler"]
  assert smp["steps"] == 24 and smp["same_tokens"]
  assert smp["speedup"]["n"] == 2 and all(t > 0 for t in smp["cached"]["values"])
  # A task the config does not have is refused with the ones it has (in this process: the
  # refusal comes before any program, and a new process would mostly import JAX).
  import bench_memory_update

  capsys.readouterr()
  with pytest.raises(SystemExit) as exit_:
    bench_memory_update.main(["--task", "nope", "--out", str(tmp_path / "y.json")])
  assert exit_.value.code == 2 and "known: retention" in capsys.readouterr().err
  with pytest.raises(SystemExit) as exit_:
    bench_memory_update.main(["--arms", "compressed,nope", "--out", str(tmp_path / "y.json")])
  assert (
    exit_.value.code == 2 and "known compressed, uncompressed_memory" in capsys.readouterr().err
  )
