"""TFDS builder for GSM8K from the user's own copy (a manual directory; nothing is downloaded).

The manual directory holds the published `train.jsonl` and `test.jsonl` (one
`{"question": ..., "answer": "...#### 72"}` object per line, as in the grade-school-math
repository's `grade_school_math/data/`). The builder stores them as ArrayRecord, read back
with `as_data_source()` like the generated tasks (see `sao_jax.data.tfds_base`), and
`load_tasks` turns records into `Task`s with `sao_jax.envs.gsm8k.parse_record`.

The config name carries a digest of the two files, so a different or edited copy builds
into its own folder instead of silently reusing an older build. A malformed line is an
error naming its file and line number.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
from collections.abc import Iterator

import numpy as np
import tensorflow_datasets as tfds

from sao_jax.data.tfds_base import LocalDatasetInfo, decode_text, default_data_dir, quiet_tfds
from sao_jax.envs.base import Task
from sao_jax.envs.gsm8k import PROMPT_TEMPLATE, TRAIN_ID_OFFSET, parse_record

SPLIT_FILES = {"train": "train.jsonl", "test": "test.jsonl"}


def _digest(manual_dir: pathlib.Path) -> str:
  h = hashlib.sha256()
  for split in sorted(SPLIT_FILES):
    h.update((manual_dir / SPLIT_FILES[split]).read_bytes())
  return h.hexdigest()[:12]


@dataclasses.dataclass(eq=False)
class GSM8KConfig(tfds.core.BuilderConfig):
  """One copy of the data, named by its digest; make it with :meth:`for_dir`."""

  @classmethod
  def for_dir(cls, manual_dir: str | pathlib.Path) -> GSM8KConfig:
    manual_dir = pathlib.Path(manual_dir)
    missing = [f for f in SPLIT_FILES.values() if not (manual_dir / f).is_file()]
    if missing:
      raise FileNotFoundError(
        f"GSM8K manual directory {str(manual_dir)!r} lacks {missing}; "
        f"{Gsm8k.MANUAL_DOWNLOAD_INSTRUCTIONS.strip()}"
      )
    return cls(name=f"sha{_digest(manual_dir)}", description=f"GSM8K from {manual_dir}")


class Gsm8k(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """GSM8K train/test from a manual directory, stored as ArrayRecord."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
    "Put the published train.jsonl and test.jsonl of GSM8K (one JSON object with 'question' "
    "and 'answer' per line) into one directory and pass it as manual_dir."
  )
  code_path = None  # see ArithmeticTasks: no checksums file to look for

  def __init__(self, *, config: GSM8KConfig, data_dir: str | None = None):
    super().__init__(config=config, data_dir=data_dir, file_format="array_record")

  def _info(self) -> tfds.core.DatasetInfo:
    return LocalDatasetInfo(
      builder=self,
      description="GSM8K grade-school math word problems (Cobbe et al. 2021).",
      features=tfds.features.FeaturesDict(
        {
          "index": tfds.features.Scalar(dtype=np.int64),
          "question": tfds.features.Text(),
          "answer": tfds.features.Text(),
        }
      ),
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    manual = pathlib.Path(dl_manager.manual_dir)
    return {split: self._generate_examples(manual / name) for split, name in SPLIT_FILES.items()}

  def _generate_examples(self, path: pathlib.Path) -> Iterator[tuple[int, dict]]:
    index = 0
    with open(path, encoding="utf-8") as f:
      for line_no, line in enumerate(f, 1):
        if not line.strip():
          continue
        try:
          record = json.loads(line)
          question, answer = record["question"], record["answer"]
          parse_record(index, question, answer)  # fail at build time, not at training time
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
          raise ValueError(f"{path}:{line_no}: not a GSM8K record ({e})") from None
        yield index, {"index": index, "question": question, "answer": answer}
        index += 1


def load_tasks(
  manual_dir: str | pathlib.Path,
  split: str,
  *,
  data_dir: str | None = None,
  template: str = PROMPT_TEMPLATE,
) -> list[Task]:
  """The `split` ("train" or "test") of the copy in `manual_dir`, in file order.

  Task ids are the line order within the split: 0..n-1 for test, TRAIN_ID_OFFSET + i for
  train. Builds into `data_dir` (default: `$SAO_JAX_DATA_DIR` or ~/.cache/sao_jax/tfds) on
  first use; call it once before starting sampler processes (see tfds_base.load_split).
  """
  if split not in SPLIT_FILES:
    raise ValueError(f"split must be 'train' or 'test', got {split!r}")
  config = GSM8KConfig.for_dir(manual_dir)
  with quiet_tfds():
    builder = Gsm8k(config=config, data_dir=data_dir or default_data_dir())
    builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(manual_dir=str(manual_dir))
    )
  source = builder.as_data_source(split=split)
  offset = TRAIN_ID_OFFSET if split == "train" else 0
  records = sorted(source.__getitems__(range(len(source))), key=lambda ex: int(ex["index"]))
  return [
    parse_record(
      offset + int(ex["index"]), decode_text(ex["question"]), decode_text(ex["answer"]), template
    )
    for ex in records
  ]
