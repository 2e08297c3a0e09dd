"""A discrete-event model of the SAO pipeline (samplers -> transport -> learner) and of
synchronous GRPO, driven by costs measured on a machine (`experiments/calibrate_sim.py`).

  costs = Costs.from_dict(json.load(open(costs_json))["costs"])
  metrics = simulate(costs, preset("sao_inflight", Scenario(seconds=240, refill_rows=8)))

`sao-jax simulate` runs it from the command line.
"""

from sao_jax.sim.costs import POLICIES, PRESETS, Costs, Profile, Scenario, interp, preset
from sao_jax.sim.engine import Simulation, format_table, simulate

__all__ = [
  "POLICIES",
  "PRESETS",
  "Costs",
  "Profile",
  "Scenario",
  "Simulation",
  "format_table",
  "interp",
  "preset",
  "simulate",
]
