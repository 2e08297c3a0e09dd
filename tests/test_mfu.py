"""The FLOP counts and summaries of experiments/bench_learner.py (`sao_jax.bench.mfu`), on
numbers: nothing is compiled or timed."""

from __future__ import annotations

import numpy as np
import pytest

from sao_jax.bench.mfu import analytic_flops, matmul_peak, mean_se, repeats_summary, span_flops


def test_analytic_flops_terms():
  f = analytic_flops(non_emb=10, vocab=7, width=4, depth=2, batch=3, seq_len=5)
  assert f["dense"] == 6 * 10 * 15 and f["logits"] == 6 * 7 * 4 * 15
  assert f["attention"] == 12 * 2 * 4 * 25 * 3
  assert f["total"] == f["dense"] + f["logits"] + f["attention"]
  # Real tokens: each row at its own span's length.
  model = dict(non_emb=10, vocab=7, width=4, depth=2)
  assert span_flops(10, 7, 4, 2, [5, 5, 5]) == f["total"]
  assert span_flops(10, 7, 4, 2, [2]) == analytic_flops(**model, batch=1, seq_len=2)["total"]


def test_mean_se_matmul_peak_and_repeats_summary():
  m = mean_se([1.0, 3.0])
  assert (m["mean"], m["n"], m["values"]) == (2.0, 2, [1.0, 3.0])
  assert m["se"] == pytest.approx(1.0)
  assert mean_se([2.0])["se"] is None
  peak = matmul_peak(10, "float32", np.asarray([2.0, 1.0, 4.0]))
  assert peak["flops_per_s"] == 2000.0 / 2.0 and peak["flops_per_s_best"] == 2000.0
  assert peak["reps"] == 3 and peak["time_s_min"] == 1.0
  run = {"bench": {"width": 4}, "params": {"total": 9}, "mfu_xla": None, "tokens_per_s": 5.0}
  run.update(mfu=0.5, step_time_s_median=0.1, matmul_peak_flops_per_s=1e9)
  s = repeats_summary([run, dict(run, mfu=0.7)])
  assert s["mfu"]["mean"] == pytest.approx(0.6) and s["mfu_xla"] is None
  assert s["bench"] == {"width": 4} and len(s["runs"]) == 2
