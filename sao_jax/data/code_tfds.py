"""TFDS builder that materialises the generated coding splits (`sao_jax.envs.code`).

Same design as the other generated families (see `sao_jax.data.tfds_base`): ArrayRecord files
read back with `as_data_source()` (no TensorFlow), one dynamically created `BuilderConfig` per
(spec, sizes, seed) whose name encodes all of them, e.g. `code_d1-3_lsi_h5_tf0p2_n20000_t500_s0`.
Bump `CodeTasks.VERSION` whenever `sao_jax.envs.code` changes what it generates.
"""

from __future__ import annotations

import dataclasses

import tensorflow_datasets as tfds

from sao_jax.data.tfds_base import GeneratedTasks, GeneratedTasksConfig, load_split
from sao_jax.envs.base import Task
from sao_jax.envs.code import CodeSpec, make_split


@dataclasses.dataclass(eq=False)
class CodeTasksConfig(GeneratedTasksConfig):
  """One spec, split sizes and seed; build with :meth:`create` so the name matches them."""

  spec: CodeSpec = CodeSpec()

  @staticmethod
  def spec_name(spec: CodeSpec) -> str:
    fraction = repr(spec.test_fraction).replace(".", "p")
    return f"code_d{spec.min_depth}-{spec.max_depth}_{spec.kinds}_h{spec.num_hidden}_tf{fraction}"


class CodeTasks(GeneratedTasks, skip_registration=True):
  """Train and test splits of `sao_jax.envs.code.make_split`, stored as ArrayRecord."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  DESCRIPTION = "Generated one-line Python coding tasks with hidden tests."

  def _make_split(self, split: str, num: int) -> list[Task]:
    # No num_test: code splits are disjoint by a hash of the program, not by regenerating test.
    cfg = self.builder_config
    return make_split(cfg.spec, split, num, cfg.seed)


def load_tasks(
  spec: CodeSpec,
  split: str,
  num_train: int,
  num_test: int,
  seed: int = 0,
  data_dir: str | None = None,
) -> list[Task]:
  """The `split` tasks for this spec, sizes and seed, sorted by task_id; equal to
  `make_split(spec, split, ...)`. Builds into `data_dir` on first use (concurrent
  builders take turns: `tfds_base.load_split`)."""
  config = CodeTasksConfig.create(spec, num_train, num_test, seed)
  return load_split(CodeTasks, config, split, data_dir)
