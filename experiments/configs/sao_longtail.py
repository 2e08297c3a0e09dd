"""Long-tailed work: arithmetic word problems of 1, 2, 3 and 4 operations in equal parts, so
completions run 9 to 30+ tokens (mean ~20): the setting in which a synchronous batch waits
for its longest row and continuous batching pays only for the mean. Otherwise the default
SAO arithmetic config (experiments/configs/sao_arith.py).

Run (SFT, then 240 s of SAO with continuous batching and in-flight weight updates):
  sao-jax train --config experiments/configs/sao_longtail.py --workdir runs/longtail
Side by side with synchronous GRPO(N=8), roles pinned to separate cores, three seeds:
  python experiments/bench_sync_vs_async.py --config experiments/configs/sao_longtail.py \\
      --arms grpo,grpo_samplers,sao --set samplers.pin_cores=True
Run the tiny variant (seconds):
  sao-jax train --config experiments/configs/sao_longtail.py:tiny --workdir runs/longtail_tiny
"""

import dataclasses
import importlib.util
import pathlib

from sao_jax.config import Config

_spec = importlib.util.spec_from_file_location(
  "sao_arith", pathlib.Path(__file__).with_name("sao_arith.py")
)
_sao = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_sao)


def get_config(variant: str = "default") -> Config:
  base = _sao.get_config(variant)
  return dataclasses.replace(
    base,
    name=base.name.replace("sao_arith", "sao_longtail"),
    model=dataclasses.replace(base.model, max_len=112),
    task=dataclasses.replace(
      base.task, n_ops_mix=(1, 2, 3, 4), num_test=max(base.task.num_test, 64)
    ),
    rl=dataclasses.replace(base.rl, max_new_tokens=40),
  )
