"""What the task datasets on TFDS share: where they live, quiet builds, text decoding, and the
builder for generated train/test splits.

Why TFDS for generated data: every consumer (samplers in other processes or on other
machines, evaluation, notebooks) then reads the same frozen, versioned files by split name
instead of re-running the generator and trusting its determinism, and the dataset sits next
to any shipped datasets behind the same API. The files are ArrayRecord, read with
`as_data_source()` (random access, pure Python), so TensorFlow is never imported.

A generated family (`sao_jax.data.arithmetic_tfds`, `code_tfds`, `longhorizon_tfds`) is a
:class:`GeneratedTasks` subclass, whose class name is the dataset's name and folder, plus a
:class:`GeneratedTasksConfig` subclass: each (spec, sizes, seed) is its own dynamically
created `BuilderConfig` whose name encodes all of them, so different specs never collide in
one data_dir. Bump a subclass's `VERSION` whenever its generator changes what it generates:
data built by the old code is otherwise silently reused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import io
import os
from collections.abc import Iterator
from typing import Any, Self

import numpy as np
import tensorflow_datasets as tfds
from absl import logging
from tensorflow_datasets.core.utils import tqdm_utils

from sao_jax.envs.base import Task

DATA_DIR_ENV = "SAO_JAX_DATA_DIR"
SPLITS = ("train", "test")


@dataclasses.dataclass(eq=False)
class GeneratedTasksConfig(tfds.core.BuilderConfig):
  """One spec, split sizes and seed; build with :meth:`create` so the name matches them.

  A subclass narrows `spec` to its family's spec type and implements :meth:`spec_name`.
  """

  spec: Any = None
  num_train: int = 0
  num_test: int = 0
  seed: int = 0

  @classmethod
  def create(cls, spec: Any, num_train: int, num_test: int, seed: int = 0) -> Self:
    """The config named `<spec_name(spec)>_n<num_train>_t<num_test>_s<seed>`."""
    return cls(
      name=f"{cls.spec_name(spec)}_n{num_train}_t{num_test}_s{seed}",
      description=f"{spec}, {num_train} train, {num_test} test, seed {seed}",
      spec=spec,
      num_train=num_train,
      num_test=num_test,
      seed=seed,
    )

  @staticmethod
  def spec_name(spec: Any) -> str:
    """The part of the config name that identifies `spec` (every field that changes data)."""
    raise NotImplementedError("a GeneratedTasksConfig subclass must define spec_name")


class LocalDatasetInfo(tfds.core.DatasetInfo):
  """The DatasetInfo of a builder defined here: none of them is on the public TFDS bucket.

  TFDS 4.9 looks there (`initialize_from_bucket`) whenever a builder's data is not prepared
  yet, and leaves an empty temporary folder behind each time (with GCS off, as here, it finds
  nothing either way); every first build of a dataset left one in the system temp folder."""

  def initialize_from_bucket(self) -> None:
    return None


# skip_registration: configs are made on the fly, so `tfds.builder(name)` could not find them
# anyway, and an unregistered class survives module reloads without a "Dataset with name ...
# already registered" error. Subclasses pass it too (it is not inherited).
class GeneratedTasks(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Train and test splits of a generator, stored as ArrayRecord with `Task`'s fields.

  A subclass sets `VERSION`, `RELEASE_NOTES` and `DESCRIPTION`, and implements
  :meth:`_make_split`; its `builder_config` is a :class:`GeneratedTasksConfig`.
  """

  DESCRIPTION = ""
  # TFDS only uses the code path to find a download-checksums file next to the builder, which
  # generated data has none of; and finding it for a builder inside a package imports
  # `importlib_resources`, which tensorflow-datasets 4.9.10 needs but does not declare.
  code_path = None

  def __init__(self, *, config: GeneratedTasksConfig, data_dir: str | None = None):
    super().__init__(config=config, data_dir=data_dir, file_format="array_record")

  def _info(self) -> tfds.core.DatasetInfo:
    # Not `self.dataset_info_from_configs(...)`: it looks for metadata files next to a
    # registered TFDS package and raises NotADirectoryError for a builder defined here.
    return LocalDatasetInfo(
      builder=self,
      description=self.DESCRIPTION,
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
      "train": self._generate_examples(self._make_split("train", cfg.num_train)),
      "test": self._generate_examples(self._make_split("test", cfg.num_test)),
    }

  def _make_split(self, split: str, num: int) -> list[Task]:
    """The `num` tasks of `split` for `self.builder_config`."""
    raise NotImplementedError("a GeneratedTasks subclass must define _make_split")

  def _generate_examples(self, tasks: list[Task]) -> Iterator[tuple[int, dict]]:
    for task in tasks:
      yield task.task_id, dataclasses.asdict(task)


def load_split(
  builder_cls: type[GeneratedTasks],
  config: GeneratedTasksConfig,
  split: str,
  data_dir: str | None = None,
) -> list[Task]:
  """The `split` tasks of `builder_cls` with `config`, sorted by task_id.

  Builds the dataset into `data_dir` (default :func:`default_data_dir`) on first use (a few
  seconds for 20k tasks) and reads it back afterwards. The result equals what the builder's
  generator makes exactly; sorting is needed because TFDS stores records in the order of
  their hashed keys.

  Processes that build the same config at once (a sweep's first trials, samplers) take
  turns on a file lock in the data directory: unguarded, they race on TFDS's final rename of
  the build folder and all but one fail. The lock is held only while building or checking.
  """
  if split not in SPLITS:
    raise ValueError(f"split must be 'train' or 'test', got {split!r}")
  data_dir = data_dir or default_data_dir()
  with quiet_tfds(), _build_lock(data_dir):
    builder = builder_cls(config=config, data_dir=data_dir)
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


@contextlib.contextmanager
def _build_lock(data_dir: str) -> Iterator[None]:
  """An exclusive flock on DATA_DIR/.build.lock (released when the process dies, so a
  killed builder never leaves it held)."""
  os.makedirs(data_dir, exist_ok=True)
  with open(os.path.join(data_dir, ".build.lock"), "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def default_data_dir() -> str:
  """`$SAO_JAX_DATA_DIR`, else `~/.cache/sao_jax/tfds`."""
  return os.environ.get(DATA_DIR_ENV) or os.path.expanduser("~/.cache/sao_jax/tfds")


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
