"""The cluster simulator on cases whose answers can be worked out by hand."""

from __future__ import annotations

import dataclasses
import json

import pytest

from sao_jax import cli
from sao_jax.config import ConfigError
from sao_jax.sim import Costs, Profile, Scenario, Simulation, interp, preset, simulate


def _costs(lengths=(10,), decode=0.01, prefill=0.05, update=0.001, **kw) -> Costs:
  prof = Profile(decode_s=((8, decode),), prefill_s=((8, prefill),))
  flat = Profile(decode_s=((1, decode), (1024, decode)), prefill_s=((1, prefill), (1024, prefill)))
  return Costs(
    profiles={"sampler": prof, "inline": flat, "flat": flat},
    update_s={k: ((1, update), (1024, update)) for k in ("sao", "grpo")},
    lengths=lengths,
    **kw,
  )


def test_interp_is_piecewise_linear_and_extrapolates():
  pts = ((1.0, 1.0), (3.0, 2.0), (5.0, 6.0))
  assert interp(pts, 2.0) == pytest.approx(1.5)
  assert interp(pts, 7.0) == pytest.approx(10.0)  # last segment's slope 2
  assert interp(pts, 0.0) == pytest.approx(0.5)
  assert interp(((4.0, 2.0),), 2.0) == pytest.approx(1.0)  # one point: proportional


def test_one_sampler_constant_lengths_throughput_is_closed_form():
  # A call of 8 rows of 10 tokens: 0.05 + 10 * 0.01 = 0.15 s; the learner is ~free, so the
  # sampler never idles: 8 / 0.15 = 53.33 trajectories/s.
  sc = Scenario(policy="sao_batch", num_samplers=1, slots=8, batch_size=8, steps=300)
  m = simulate(_costs(), sc)
  assert m["trajectories_per_s_steady"] == pytest.approx(8 / 0.15, rel=1e-3)
  assert m["decode_row_efficiency"] == pytest.approx(1.0)


def test_sync_grpo_utilisation_is_update_over_sample_plus_update():
  # inline GRPO, 8 rows of 10 tokens: sampling 0.05 + 10 * 0.01 = 0.15 s, update 0.3 s.
  c = _costs(update=0.3)
  m = simulate(c, preset("grpo_inline", Scenario(batch_size=8, steps=50)))
  assert m["learner_busy"] == pytest.approx(0.3 / 0.45, rel=1e-9)
  assert m["learner_steps_per_s"] == pytest.approx(1 / 0.45, rel=1e-9)
  assert m["delay_mean_s"] == pytest.approx(0.3)
  assert m["staleness_hist"][0] == m["trajectories"] == 400


def test_delay_from_own_last_token_counts_the_wait_for_the_longest_row():
  # rows of 5 or 15 tokens at 0.01 s per step: a 5-token row ends 0.1 s before its call
  m = simulate(
    _costs(lengths=(5, 15), update=0.3), preset("grpo_inline", Scenario(batch_size=8, steps=200))
  )
  assert m["delay_own_mean_s"] - m["delay_mean_s"] == pytest.approx(0.05, rel=0.1)


def test_grpo_with_samplers_pays_the_barrier_and_the_weight_load():
  # two samplers each take one 8-row call: 0.15 s; + load 0.02 before it; update 0.3;
  # publish 0.01 after it. Step = 0.02 + 0.15 + 0.3 + 0.01 = 0.48 s.
  c = _costs(update=0.3, load_s=0.02, publish_s=0.01)
  m = simulate(
    c,
    preset("grpo", Scenario(num_samplers=2, slots=8, batch_size=16, steps=40, update_kind="grpo")),
  )
  assert m["learner_steps_per_s_steady"] == pytest.approx(1 / 0.48, rel=1e-6)
  assert m["learner_busy_steady"] == pytest.approx(0.3 / 0.48, rel=1e-6)


def test_learner_bound_sao_keeps_the_learner_busy():
  # Samplers far faster than the learner: it waits only when its backlog runs dry (tasks
  # are topped up only while a batch is short, as in the runner): busy -> 1, steps/s -> 2.
  c = _costs(update=0.5)
  m = simulate(
    c,
    preset(
      "sao_inflight", Scenario(num_samplers=8, slots=8, batch_size=8, max_staleness=1000, steps=100)
    ),
  )
  assert m["learner_busy_steady"] > 0.97
  assert m["learner_steps_per_s_steady"] == pytest.approx(2.0, rel=0.03)


def test_continuous_batching_removes_the_straggler_cost():
  # Rows of 1 or 19 tokens, no prefill: a call of 64 rows almost surely waits 19 steps
  # (mean 10 live), a refilled slot is always live: 64 / (10 * 0.01) = 640 trajectories/s.
  c = _costs(lengths=(1, 19), prefill=0.0)
  c = c.replace(profiles={"sampler": Profile(decode_s=((64, 0.01),), prefill_s=((64, 0.0),))})
  base = Scenario(num_samplers=1, slots=64, batch_size=64, steps=200)
  cont = simulate(c, preset("sao_inflight", base))
  batch = simulate(c, preset("sao_batch", base))
  assert cont["trajectories_per_s_steady"] == pytest.approx(640, rel=0.03)
  assert batch["trajectories_per_s_steady"] == pytest.approx(64 / 0.19, rel=0.03)
  assert batch["decode_row_efficiency"] == pytest.approx(10 / 19, rel=0.03)


def test_inflight_updates_beat_draining_when_sampling_binds():
  # A version every 8 trajectories, rows of 5 or 30 tokens: without in-flight updates a
  # continuous sampler drains for every version and is no faster than the batch sampler;
  # with them its slots stay full: 2 * 8 rows / 0.01 s = 1600 tokens/s.
  c = _costs(lengths=(5, 30), prefill=0.0)
  base = Scenario(num_samplers=2, slots=8, batch_size=8, steps=100, max_staleness=8)
  inflight = simulate(c, preset("sao_inflight", base))
  drain = simulate(c, preset("sao_continuous", base))
  batch = simulate(c, preset("sao_batch", base))
  assert inflight["tokens_per_s"] == pytest.approx(1600, rel=0.02)
  assert drain["trajectories_per_s"] == pytest.approx(batch["trajectories_per_s"], rel=0.02)
  assert inflight["decode_row_efficiency"] == pytest.approx(1.0)


def _slot_costs(**kw) -> Costs:
  """_costs with the continuous-batching programs measured: fill(8 rows) 0.05 s, a decode
  call 0.01 s + 0.002 s per step (8 slots), refresh 0.1 s."""
  c = _costs(**kw)
  prof = Profile(
    decode_s=((8, 0.01),),
    prefill_s=((8, 0.05),),
    fill_s=((8, 0.05),),
    slot_decode_s=((1, 0.002), (8, 0.002)),
    slot_rows=8,
    decode_call_s=0.01,
    refresh_s=((8, 0.1),),
  )
  return c.replace(profiles={**c.profiles, "sampler": prof})


def test_grpo_through_continuous_samplers_is_closed_form():
  # 16 rows of 10 tokens through one sampler of 8 slots, 8 prompts per fill: twice (fill
  # 0.05 + decode call 0.01 + 10 * 0.002) = 0.16 s; + load 0.02, update 0.3, publish 0.01.
  c = _slot_costs(update=0.3, load_s=0.02, publish_s=0.01)
  m = simulate(
    c,
    preset(
      "grpo_continuous",
      Scenario(num_samplers=1, slots=8, refill_rows=8, batch_size=16, steps=40, update_kind="grpo"),
    ),
  )
  assert m["learner_steps_per_s_steady"] == pytest.approx(1 / 0.49, rel=1e-6)


def test_decode_calls_wait_for_refill_rows_completions():
  # A call that waits for all 64 of its rows is a batch call again: the straggler cost is back.
  c = _costs(lengths=(1, 19), prefill=0.0)
  c = c.replace(profiles={"sampler": Profile(decode_s=((64, 0.01),), prefill_s=((64, 0.0),))})
  base = Scenario(num_samplers=1, slots=64, batch_size=64, steps=200, refill_rows=64)
  cont = simulate(c, preset("sao_inflight", base))
  assert cont["trajectories_per_s_steady"] == pytest.approx(64 / 0.19, rel=0.03)
  assert cont["decode_row_efficiency"] == pytest.approx(10 / 19, rel=0.03)


def test_inflight_updates_pay_the_cache_refresh_and_draining_does_not():
  # Rows of 5 or 30 tokens, a version every 8 trajectories: in-flight swaps find rows in
  # flight and pay the refresh; a draining sampler swaps with none in flight.
  base = Scenario(num_samplers=1, slots=8, refill_rows=1, batch_size=8, steps=60, max_staleness=8)
  cheap, dear = _slot_costs(lengths=(5, 30)), _slot_costs(lengths=(5, 30))
  cheap = cheap.replace(
    profiles={"sampler": dataclasses.replace(cheap.profiles["sampler"], refresh_s=((8, 0.0),))}
  )
  inflight = [simulate(c, preset("sao_inflight", base)) for c in (cheap, dear)]
  drain = [simulate(c, preset("sao_continuous", base)) for c in (cheap, dear)]
  assert inflight[1]["trajectories_per_s"] < 0.9 * inflight[0]["trajectories_per_s"]
  assert drain[1] == drain[0]


def test_staleness_bound_drops_old_records():
  # 16 samplers far ahead of a slow learner that takes only fresh (same-version) records
  c = _costs(update=0.2)
  m = simulate(
    c,
    preset(
      "sao_batch", Scenario(num_samplers=16, slots=8, batch_size=8, max_staleness=0, steps=30)
    ),
  )
  assert m["dropped_stale"] > 0
  assert m["staleness_hist"][0] == m["trajectories"]


def test_colocated_work_shares_the_cores():
  import heapq

  c = _costs().replace(update_with_sampling=2.0, sampling_with_update=2.0)
  sim = Simulation(c, Scenario(colocated=True, steps=1))
  ends = {}
  host = sim.learner_host
  sim.start(host, "update", 1.0, lambda: ends.setdefault("update", sim.now))
  sim.start(host, "sample", 0.5, lambda: ends.setdefault("sample", sim.now))
  while sim._q:
    t, _, fn, args = heapq.heappop(sim._q)
    sim.now = t
    fn(*args)
  # both at half speed until the sample ends at 1.0; the update's last 0.5 s then alone
  assert ends == pytest.approx({"sample": 1.0, "update": 1.5})


def test_deterministic_given_a_seed():
  c = _costs(lengths=(3, 7, 12, 20))
  sc = preset("sao_inflight", Scenario(num_samplers=2, slots=8, batch_size=16, seconds=20))
  a, b = simulate(c, sc), simulate(c, sc)
  other = simulate(c, Scenario(**{**sc.__dict__, "seed": 1}))
  assert a == b
  assert a["delay_mean_s"] != other["delay_mean_s"]


def test_costs_json_round_trip_and_clear_errors():
  for c in (_costs(lengths=(4, 9), periodic={"sao": (("shadow", 50, 0.5),)}), _slot_costs()):
    again = Costs.from_dict(json.loads(json.dumps(c.to_dict())))
    assert again == c
  with pytest.raises(ConfigError, match="slot_rows"):
    Profile(decode_s=((8, 0.01),), prefill_s=((8, 0.05),), slot_decode_s=((8, 0.002),))
  with pytest.raises(ConfigError, match="refill_rows"):
    Scenario(slots=8, refill_rows=9, seconds=1)
  with pytest.raises(ConfigError, match="unknown keys"):
    Costs.from_dict({**c.to_dict(), "decode": 1})
  with pytest.raises(ConfigError, match="policy"):
    Scenario(policy="fast", seconds=1)
  with pytest.raises(ConfigError, match="horizon"):
    Scenario()


def test_cli_simulate_prints_the_table_and_writes_json(tmp_path, capfd):
  costs = tmp_path / "costs.json"
  costs.write_text(json.dumps({"costs": _costs().to_dict()}))
  out = tmp_path / "sim.json"
  rc = cli.main(
    [
      "simulate",
      "--costs",
      str(costs),
      "--policy",
      "grpo_inline,sao_batch",
      "--set",
      "slots=8",
      "--set",
      "batch_size=8",
      "--set",
      "seconds=5.0",
      "--out",
      str(out),
    ]
  )
  assert rc == 0
  assert "trajectories/s" in capfd.readouterr().out
  res = json.loads(out.read_text())["results"]
  assert res["sao_batch"]["trajectories_per_s"] > 0 and set(res) == {"grpo_inline", "sao_batch"}
  assert cli.main(["simulate", "--costs", str(costs), "--policy", "nope"]) == 2
