"""TFDS builder for the long-horizon tasks (ArrayRecord, read back without TensorFlow).

Same design as `sao_jax.data.arithmetic_tfds` (see its docstring for why TFDS): one
dynamically created `BuilderConfig` per (spec, sizes, seed), named after all of them, e.g.
`retention_n40_f4_g32_p10_b0_n2000_t200_s0`. Bump `LongHorizonTasks.VERSION` whenever
`sao_jax.envs.longhorizon` changes what it generates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import tensorflow_datasets as tfds

from sao_jax.data.arithmetic_tfds import decode_text, default_data_dir, quiet_tfds
from sao_jax.envs.base import Task
from sao_jax.envs.longhorizon import LongHorizonSpec, make_split


@dataclasses.dataclass(eq=False)
class LongHorizonTasksConfig(tfds.core.BuilderConfig):
  """One spec, split sizes and seed; build with :meth:`create` so the name matches them."""

  spec: LongHorizonSpec = LongHorizonSpec()
  num_train: int = 0
  num_test: int = 0
  seed: int = 0

  @classmethod
  def create(
    cls, spec: LongHorizonSpec, num_train: int, num_test: int, seed: int = 0
  ) -> LongHorizonTasksConfig:
    name = f"{spec.name}_n{num_train}_t{num_test}_s{seed}"
    return cls(
      name=name,
      description=f"{spec}, {num_train} train, {num_test} test, seed {seed}",
      spec=spec,
      num_train=num_train,
      num_test=num_test,
      seed=seed,
    )


class LongHorizonTasks(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Train and test splits of `sao_jax.envs.longhorizon.make_split`, stored as ArrayRecord."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  code_path = None  # see ArithmeticTasks: generated data has no checksums file

  def __init__(self, *, config: LongHorizonTasksConfig, data_dir: str | None = None):
    super().__init__(config=config, data_dir=data_dir, file_format="array_record")

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
      builder=self,
      description="Generated long-horizon episodes (dialogue retention, corridor navigation).",
      features=tfds.features.FeaturesDict(
        {
          "task_id": tfds.features.Scalar(dtype=np.int64),
          "prompt": tfds.features.Text(),
          "solution": tfds.features.Text(),
          "answer": tfds.features.Text(),
          "difficulty": tfds.features.Scalar(dtype=np.int32),
        }
      ),
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    del dl_manager
    cfg = self.builder_config
    return {
      "train": self._generate_examples(
        make_split(cfg.spec, "train", cfg.num_train, cfg.seed, num_test=cfg.num_test)
      ),
      "test": self._generate_examples(make_split(cfg.spec, "test", cfg.num_test, cfg.seed)),
    }

  def _generate_examples(self, tasks: list[Task]) -> Iterator[tuple[int, dict]]:
    for task in tasks:
      yield task.task_id, dataclasses.asdict(task)


def load_tasks(
  spec: LongHorizonSpec,
  split: str,
  num_train: int,
  num_test: int,
  seed: int = 0,
  data_dir: str | None = None,
) -> list[Task]:
  """The `split` tasks for this spec, sizes and seed, sorted by task_id; equals `make_split`.

  Builds into `data_dir` on first use. Call once before starting sampler processes (two
  processes building the same config race on TFDS's final rename).
  """
  if split not in ("train", "test"):
    raise ValueError(f"split must be 'train' or 'test', got {split!r}")
  config = LongHorizonTasksConfig.create(spec, num_train, num_test, seed)
  with quiet_tfds():
    builder = LongHorizonTasks(config=config, data_dir=data_dir or default_data_dir())
    builder.download_and_prepare()
  source = builder.as_data_source(split=split)
  tasks = [
    Task(
      task_id=int(ex["task_id"]),
      prompt=decode_text(ex["prompt"]),
      solution=decode_text(ex["solution"]),
      answer=decode_text(ex["answer"]),
      difficulty=int(ex["difficulty"]),
    )
    for ex in source.__getitems__(range(len(source)))
  ]
  return sorted(tasks, key=lambda t: t.task_id)
