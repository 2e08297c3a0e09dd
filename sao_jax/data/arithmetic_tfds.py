"""TFDS builder that materialises the generated arithmetic splits, read back without TensorFlow.

See `sao_jax.data.tfds_base` for why TFDS and how the generated families are stored. Each
(spec, sizes, seed) gets its own config, named after all of them, e.g.
`ops2_max20_pm_rev0_n20000_t500_s0`. Bump `ArithmeticTasks.VERSION` whenever
`sao_jax.envs.arithmetic` changes what it generates: data built by the old code is otherwise
silently reused.
"""

from __future__ import annotations

import dataclasses

import tensorflow_datasets as tfds

from sao_jax.data.tfds_base import GeneratedTasks, GeneratedTasksConfig, load_split
from sao_jax.envs.arithmetic import ArithmeticSpec, make_split
from sao_jax.envs.base import Task

_OP_CODES = {"+": "p", "-": "m", "*": "t"}


@dataclasses.dataclass(eq=False)
class ArithmeticTasksConfig(GeneratedTasksConfig):
  """One spec, split sizes and seed; build with :meth:`create` so the name matches them."""

  spec: ArithmeticSpec = ArithmeticSpec()

  @staticmethod
  def spec_name(spec: ArithmeticSpec) -> str:
    ops = "".join(_OP_CODES[op] for op in spec.ops)
    return f"ops{spec.n_ops}_max{spec.max_operand}_{ops}_rev{int(spec.reverse_digits)}"


class ArithmeticTasks(GeneratedTasks, skip_registration=True):
  """Train and test splits of `sao_jax.envs.arithmetic.make_split`, stored as ArrayRecord."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  DESCRIPTION = "Generated GSM8K-style multi-step arithmetic word problems."

  def _make_split(self, split: str, num: int) -> list[Task]:
    cfg = self.builder_config
    return make_split(cfg.spec, split, num, cfg.seed, num_test=cfg.num_test)


def load_tasks(
  spec: ArithmeticSpec,
  split: str,
  num_train: int,
  num_test: int,
  seed: int = 0,
  data_dir: str | None = None,
) -> list[Task]:
  """The `split` tasks for this spec, sizes and seed, sorted by task_id; equals
  `make_split(spec, split, ...)`. Builds into `data_dir` on first use (concurrent
  builders take turns: `tfds_base.load_split`)."""
  config = ArithmeticTasksConfig.create(spec, num_train, num_test, seed)
  return load_split(ArithmeticTasks, config, split, data_dir)
