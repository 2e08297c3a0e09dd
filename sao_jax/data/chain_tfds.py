"""TFDS builder that materialises the generated heavy-tailed chain splits (`sao_jax.envs.chain`).

Same design as the other generated families (see `sao_jax.data.tfds_base`): ArrayRecord files
read back with `as_data_source()` (no TensorFlow), one dynamically created `BuilderConfig` per
(spec, sizes, seed) whose name encodes all of them, e.g.
`chain_zipf_a2p0_k1-24_s99_o9_m99_tf0p2_n20000_t500_s0`. Bump `ChainTasks.VERSION` whenever
`sao_jax.envs.chain` changes what it generates.
"""

from __future__ import annotations

import dataclasses

import tensorflow_datasets as tfds

from sao_jax.data.tfds_base import GeneratedTasks, GeneratedTasksConfig, load_split
from sao_jax.envs.base import Task
from sao_jax.envs.chain import ChainSpec, make_split


def _num(x: float) -> str:
  return repr(float(x)).replace(".", "p").replace("-", "m")


@dataclasses.dataclass(eq=False)
class ChainTasksConfig(GeneratedTasksConfig):
  """One spec, split sizes and seed; build with :meth:`create` so the name matches them."""

  spec: ChainSpec = ChainSpec()

  @staticmethod
  def spec_name(spec: ChainSpec) -> str:
    law = (
      f"a{_num(spec.alpha)}" if spec.law == "zipf" else f"mu{_num(spec.mu)}_sd{_num(spec.sigma)}"
    )
    return (
      f"chain_{spec.law}_{law}_k{spec.min_steps}-{spec.max_steps}_s{spec.max_start}"
      f"_o{spec.max_operand}_m{spec.max_total}_tf{_num(spec.test_fraction)}"
    )


class ChainTasks(GeneratedTasks, skip_registration=True):
  """Train and test splits of `sao_jax.envs.chain.make_split`, stored as ArrayRecord."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  DESCRIPTION = "Generated arithmetic chains with a heavy-tailed number of steps."

  def _make_split(self, split: str, num: int) -> list[Task]:
    # No num_test: chain splits are disjoint by a hash of the problem, as code splits are.
    cfg = self.builder_config
    return make_split(cfg.spec, split, num, cfg.seed)


def load_tasks(
  spec: ChainSpec,
  split: str,
  num_train: int,
  num_test: int,
  seed: int = 0,
  data_dir: str | None = None,
) -> list[Task]:
  """The `split` tasks for this spec, sizes and seed, sorted by task_id; equal to
  `make_split(spec, split, ...)`. Builds into `data_dir` on first use (concurrent
  builders take turns: `tfds_base.load_split`)."""
  config = ChainTasksConfig.create(spec, num_train, num_test, seed)
  return load_split(ChainTasks, config, split, data_dir)
