"""TFDS builder that materialises the generated coding splits (`sao_jax.envs.code`).

Same design as `sao_jax.data.arithmetic_tfds`: ArrayRecord files read back with
`as_data_source()` (no TensorFlow), one dynamically created `BuilderConfig` per (spec,
sizes, seed) whose name encodes all of them, e.g. `code_d1-3_lsi_h5_tf0p2_n20000_t500_s0`.
Bump `CodeTasks.VERSION` whenever `sao_jax.envs.code` changes what it generates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import tensorflow_datasets as tfds

from sao_jax.data.arithmetic_tfds import decode_text, default_data_dir, quiet_tfds
from sao_jax.envs.base import Task
from sao_jax.envs.code import CodeSpec, make_split


@dataclasses.dataclass(eq=False)
class CodeTasksConfig(tfds.core.BuilderConfig):
  """One spec, split sizes and seed; build with :meth:`create` so the name matches them."""

  spec: CodeSpec = CodeSpec()
  num_train: int = 0
  num_test: int = 0
  seed: int = 0

  @classmethod
  def create(cls, spec: CodeSpec, num_train: int, num_test: int, seed: int = 0) -> CodeTasksConfig:
    fraction = repr(spec.test_fraction).replace(".", "p")
    name = (
      f"code_d{spec.min_depth}-{spec.max_depth}_{spec.kinds}_h{spec.num_hidden}"
      f"_tf{fraction}_n{num_train}_t{num_test}_s{seed}"
    )
    return cls(
      name=name,
      description=f"{spec}, {num_train} train, {num_test} test, seed {seed}",
      spec=spec,
      num_train=num_train,
      num_test=num_test,
      seed=seed,
    )


class CodeTasks(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Train and test splits of `sao_jax.envs.code.make_split`, stored as ArrayRecord."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  code_path = None  # see ArithmeticTasks.code_path

  def __init__(self, *, config: CodeTasksConfig, data_dir: str | None = None):
    super().__init__(config=config, data_dir=data_dir, file_format="array_record")

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
      builder=self,
      description="Generated one-line Python coding tasks with hidden tests.",
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
    del dl_manager  # everything is generated; nothing to download
    cfg = self.builder_config
    return {
      "train": self._generate_examples(make_split(cfg.spec, "train", cfg.num_train, cfg.seed)),
      "test": self._generate_examples(make_split(cfg.spec, "test", cfg.num_test, cfg.seed)),
    }

  def _generate_examples(self, tasks: list[Task]) -> Iterator[tuple[int, dict]]:
    for task in tasks:
      yield task.task_id, dataclasses.asdict(task)


def load_tasks(
  spec: CodeSpec,
  split: str,
  num_train: int,
  num_test: int,
  seed: int = 0,
  data_dir: str | None = None,
) -> list[Task]:
  """The `split` tasks for this spec, sizes and seed, sorted by task_id; equal to
  `make_split(spec, split, ...)`. Builds into `data_dir` on first use. Call it once before
  starting sampler processes (concurrent builds of one config race on TFDS's rename)."""
  if split not in ("train", "test"):
    raise ValueError(f"split must be 'train' or 'test', got {split!r}")
  config = CodeTasksConfig.create(spec, num_train, num_test, seed)
  with quiet_tfds():
    builder = CodeTasks(config=config, data_dir=data_dir or default_data_dir())
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
