"""SFT warm start, then asynchronous SAO (one trajectory per task, K sampler processes).

Same model, optimiser and budget as experiments/configs/arith_grpo.py; the tasks mix 2 and 3
operations in equal parts, so that trajectories differ in length (stragglers matter).
experiments/bench_sync_vs_async.py runs this config's tasks under GRPO(N=8) and under SAO.

Run (default: 300 SFT steps, then 240 s of SAO; ~6 min on a 2-core CPU):
  sao-jax train --config experiments/configs/sao_arith.py --workdir runs/sao_arith
Run the tiny variant (seconds):
  sao-jax train --config experiments/configs/sao_arith.py:tiny --workdir runs/sao_tiny
"""
import dataclasses
import importlib.util
import pathlib

from sao_jax.config import Config, SAOConfig

_spec = importlib.util.spec_from_file_location(
    "arith_grpo", pathlib.Path(__file__).with_name("arith_grpo.py"))
_grpo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_grpo)


def get_config(variant: str = "default") -> Config:
  base = _grpo.get_config(variant)
  if variant == "default":
    sao = SAOConfig(num_samplers=1, sampler_slots=64, batch_size=128)
    num_test = 600  # 300 per part; evaluation uses the first 500 (interleaved parts)
  elif variant == "tiny":
    sao = SAOConfig(num_samplers=2, sampler_slots=8, batch_size=16)
    num_test = 66
  else:
    raise ValueError(f"unknown variant {variant!r}; known: default, tiny")
  return dataclasses.replace(
      base, name=base.name.replace("arith_grpo", "sao_arith"), sao=sao,
      task=dataclasses.replace(base.task, n_ops_mix=(2, 3), num_test=num_test),
      rl=dataclasses.replace(base.rl, algorithm="sao", max_new_tokens=32))
