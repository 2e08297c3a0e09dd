"""TFDS builder that materialises the generated arithmetic splits, read back without TensorFlow.

Why TFDS for generated data: every consumer (samplers in other processes or on other
machines, evaluation, notebooks) then reads the same frozen, versioned files by split name
instead of re-running the generator and trusting its determinism, and the dataset sits next
to any shipped datasets behind the same API. The files are ArrayRecord, read with
`as_data_source()` (random access, pure Python), so TensorFlow is never imported.

Each (spec, sizes, seed) is its own dynamically created `BuilderConfig` whose name encodes all
of them, e.g. `ops2_max20_pm_rev0_n20000_t500_s0`, so different specs never collide in one
data_dir. Bump `ArithmeticTasks.VERSION` whenever `sao_jax.envs.arithmetic` changes what it
generates: data built by the old code is otherwise silently reused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
from collections.abc import Iterator

import numpy as np
import tensorflow_datasets as tfds
from absl import logging
from tensorflow_datasets.core.utils import tqdm_utils

from sao_jax.envs.arithmetic import ArithmeticSpec, make_split
from sao_jax.envs.base import Task

DATA_DIR_ENV = "SAO_JAX_DATA_DIR"
_OP_CODES = {"+": "p", "-": "m", "*": "t"}


@dataclasses.dataclass(eq=False)
class ArithmeticTasksConfig(tfds.core.BuilderConfig):
  """One spec, split sizes and seed; build with :meth:`create` so the name matches them."""

  spec: ArithmeticSpec = ArithmeticSpec()
  num_train: int = 0
  num_test: int = 0
  seed: int = 0

  @classmethod
  def create(
    cls, spec: ArithmeticSpec, num_train: int, num_test: int, seed: int = 0
  ) -> ArithmeticTasksConfig:
    ops = "".join(_OP_CODES[op] for op in spec.ops)
    name = (
      f"ops{spec.n_ops}_max{spec.max_operand}_{ops}_rev{int(spec.reverse_digits)}"
      f"_n{num_train}_t{num_test}_s{seed}"
    )
    return cls(
      name=name,
      description=f"{spec}, {num_train} train, {num_test} test, seed {seed}",
      spec=spec,
      num_train=num_train,
      num_test=num_test,
      seed=seed,
    )


# skip_registration: configs are made on the fly, so `tfds.builder("arithmetic_tasks")` could
# not find them anyway, and an unregistered class survives module reloads without a
# "Dataset with name ... already registered" error.
class ArithmeticTasks(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Train and test splits of `sao_jax.envs.arithmetic.make_split`, stored as ArrayRecord."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  # TFDS only uses the code path to find a download-checksums file next to the builder, which
  # generated data has none of; and finding it for a builder inside a package imports
  # `importlib_resources`, which tensorflow-datasets 4.9.10 needs but does not declare.
  code_path = None

  def __init__(self, *, config: ArithmeticTasksConfig, data_dir: str | None = None):
    super().__init__(config=config, data_dir=data_dir, file_format="array_record")

  def _info(self) -> tfds.core.DatasetInfo:
    # Not `self.dataset_info_from_configs(...)`: it looks for metadata files next to a
    # registered TFDS package and raises NotADirectoryError for a builder defined here.
    return tfds.core.DatasetInfo(
      builder=self,
      description="Generated GSM8K-style multi-step arithmetic word problems.",
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
      "train": self._generate_examples(
        make_split(cfg.spec, "train", cfg.num_train, cfg.seed, num_test=cfg.num_test)
      ),
      "test": self._generate_examples(make_split(cfg.spec, "test", cfg.num_test, cfg.seed)),
    }

  def _generate_examples(self, tasks: list[Task]) -> Iterator[tuple[int, dict]]:
    for task in tasks:
      yield task.task_id, dataclasses.asdict(task)


def default_data_dir() -> str:
  """`$SAO_JAX_DATA_DIR`, else `~/.cache/sao_jax/tfds`."""
  return os.environ.get(DATA_DIR_ENV) or os.path.expanduser("~/.cache/sao_jax/tfds")


def load_tasks(
  spec: ArithmeticSpec,
  split: str,
  num_train: int,
  num_test: int,
  seed: int = 0,
  data_dir: str | None = None,
) -> list[Task]:
  """The `split` tasks for this spec, sizes and seed, sorted by task_id.

  Builds the dataset into `data_dir` on first use (a few seconds for 20k tasks) and reads it
  back afterwards. The result equals `make_split(spec, split, ...)` exactly; sorting is
  needed because TFDS stores records in the order of their hashed keys.

  Call it once before starting sampler processes: two processes building the same config at
  the same time race on TFDS's final rename of the build folder, and one of them fails.
  """
  if split not in ("train", "test"):
    raise ValueError(f"split must be 'train' or 'test', got {split!r}")
  config = ArithmeticTasksConfig.create(spec, num_train, num_test, seed)
  with quiet_tfds():
    builder = ArithmeticTasks(config=config, data_dir=data_dir or default_data_dir())
    builder.download_and_prepare()
  source = builder.as_data_source(split=split)
  # One batched read is about twice as fast as indexing record by record.
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


def decode_text(value: bytes) -> str:
  # Text features read back through `as_data_source` are bytes, not str.
  return value.decode("utf-8")


@contextlib.contextmanager
def quiet_tfds() -> Iterator[None]:
  """Silences TFDS's build chatter but keeps errors.

  Quieted: absl info/warnings (e.g. "Using custom data configuration"), the progress bars and
  the "Downloading and preparing" banner TFDS prints to stdout. Errors still log and raise.
  """
  level = logging.get_verbosity()
  bars_were_on = tqdm_utils._active  # no public getter; restored so a user's choice stands
  logging.set_verbosity(logging.ERROR)
  tfds.display_progress_bar(False)
  try:
    with contextlib.redirect_stdout(io.StringIO()):
      yield
  finally:
    tfds.display_progress_bar(bars_were_on)
    logging.set_verbosity(level)
