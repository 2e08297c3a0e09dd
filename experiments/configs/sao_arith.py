"""SFT warm start, then asynchronous SAO (one trajectory per task, K sampler processes).

Same model, tasks, optimiser and budget as experiments/configs/arith_grpo.py, so that
experiments/bench_sync_vs_async.py compares GRPO(N=8) and SAO on equal terms. Samplers run
single-threaded (small decode matmuls gain little from a second thread; the learner's do).

Run (default: 300 SFT steps, then 240 s of SAO; ~6 min on a 2-core CPU):
  sao-jax train --config experiments/configs/sao_arith.py --workdir runs/sao_arith
Run the tiny variant (seconds):
  sao-jax train --config experiments/configs/sao_arith.py:tiny --workdir runs/sao_tiny
"""

import dataclasses
import importlib.util
import pathlib

from sao_jax.config import Config, SamplersConfig, SAOConfig

_spec = importlib.util.spec_from_file_location(
  "arith_grpo", pathlib.Path(__file__).with_name("arith_grpo.py")
)
_grpo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_grpo)


def get_config(variant: str = "default") -> Config:
  base = _grpo.get_config(variant)
  if variant == "default":
    sao = SAOConfig(sampler_slots=64, batch_size=128)
    samplers = SamplersConfig(num=1, threads=1)
  elif variant == "tiny":
    sao = SAOConfig(sampler_slots=8, batch_size=16)
    samplers = SamplersConfig(num=2, threads=1)
  else:
    raise ValueError(f"unknown variant {variant!r}; known: default, tiny")
  return dataclasses.replace(
    base,
    name=base.name.replace("arith_grpo", "sao_arith"),
    sao=sao,
    samplers=samplers,
    rl=dataclasses.replace(base.rl, algorithm="sao"),
  )
