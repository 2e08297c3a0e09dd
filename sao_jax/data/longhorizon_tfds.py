"""TFDS builder for the long-horizon tasks (ArrayRecord, read back without TensorFlow).

Same design as the other generated families (see `sao_jax.data.tfds_base`): one dynamically
created `BuilderConfig` per (spec, sizes, seed), named after all of them, e.g.
`retention_n40_f4_g32_p10_b0_n2000_t200_s0`. Bump `LongHorizonTasks.VERSION` whenever
`sao_jax.envs.longhorizon` changes what it generates.
"""

from __future__ import annotations

import dataclasses

import tensorflow_datasets as tfds

from sao_jax.data.tfds_base import GeneratedTasks, GeneratedTasksConfig, load_split
from sao_jax.envs.base import Task
from sao_jax.envs.longhorizon import LongHorizonSpec, make_split


@dataclasses.dataclass(eq=False)
class LongHorizonTasksConfig(GeneratedTasksConfig):
  """One spec, split sizes and seed; build with :meth:`create` so the name matches them."""

  spec: LongHorizonSpec = LongHorizonSpec()

  @staticmethod
  def spec_name(spec: LongHorizonSpec) -> str:
    return spec.name


class LongHorizonTasks(GeneratedTasks, skip_registration=True):
  """Train and test splits of `sao_jax.envs.longhorizon.make_split`, stored as ArrayRecord."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  DESCRIPTION = "Generated long-horizon episodes (dialogue retention, corridor navigation)."

  def _make_split(self, split: str, num: int) -> list[Task]:
    cfg = self.builder_config
    return make_split(cfg.spec, split, num, cfg.seed, num_test=cfg.num_test)


def load_tasks(
  spec: LongHorizonSpec,
  split: str,
  num_train: int,
  num_test: int,
  seed: int = 0,
  data_dir: str | None = None,
) -> list[Task]:
  """The `split` tasks for this spec, sizes and seed, sorted by task_id; equals `make_split`.

  Builds into `data_dir` on first use (concurrent builders take turns:
  `tfds_base.load_split`).
  """
  config = LongHorizonTasksConfig.create(spec, num_train, num_test, seed)
  return load_split(LongHorizonTasks, config, split, data_dir)
