"""GSM8K from a local copy: TFDS builder over JSONL written here, tasks, extraction reward."""

from __future__ import annotations

import json
import pathlib

import pytest

from sao_jax.data.gsm8k_tfds import load_tasks
from sao_jax.envs.gsm8k import GSM8KEnv, extract_answer, normalise_number
from sao_jax.tokenizer import get_tokenizer

TRAIN = [
  {
    "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as "
    "many clips in May. How many clips did Natalia sell altogether in April and May?",
    "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = "
    "<<48+24=72>>72 clips altogether in April and May.\n#### 72",
  },
  {
    "question": "A company pays $1,000 a week. How much is that for 3 weeks?",
    "answer": "3 weeks cost 3*1,000 = $<<3*1000=3000>>3,000.\n#### 3,000",
  },
  {
    "question": "Betty has $2.50 and spends $3.75. How much is she short?",
    "answer": "She is short 3.75-2.50 = <<3.75-2.50=1.25>>1.25 dollars.\n#### 1.25",
  },
]
TEST = [
  {
    "question": "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of "
    "babysitting. How much did she earn?",
    "answer": "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, she "
    "earned 0.2 x 50 = $<<0.2*50=10>>10.\n#### 10",
  },
  {
    "question": "It is 5 degrees and drops by 8. What is the temperature?",
    "answer": "5-8 = <<5-8=-3>>-3\n#### -3",
  },
]
QWEN_TOKENIZER = pathlib.Path(__file__).parent / "fixtures" / "hf" / "qwen2_tiny" / "tokenizer.json"


def _write(directory: pathlib.Path, train=TRAIN, test=TEST) -> pathlib.Path:
  directory.mkdir(parents=True, exist_ok=True)
  for name, rows in (("train.jsonl", train), ("test.jsonl", test)):
    (directory / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
  return directory


def test_tasks_from_a_local_copy(tmp_path):
  manual = _write(tmp_path / "gsm8k")
  data_dir = str(tmp_path / "tfds")
  train = load_tasks(manual, "train", data_dir=data_dir)
  test = load_tasks(manual, "test", data_dir=data_dir)
  assert [t.answer for t in train] == ["72", "3000", "1.25"]
  assert [t.answer for t in test] == ["10", "-3"]
  assert [t.task_id for t in test] == [0, 1] and train[0].task_id == 10**9
  t = train[0]
  assert t.prompt == f"Question: {TRAIN[0]['question']}\nAnswer:"
  assert t.solution == (
    "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips "
    "altogether in April and May.\n#### 72"
  )
  assert t.difficulty == 2 and test[1].difficulty == 1
  # Built once: a second load reads the stored files.
  built = next((tmp_path / "tfds").glob("gsm8k/*/1.0.0/*-train.array_record*"))
  mtime = built.stat().st_mtime_ns
  assert load_tasks(manual, "train", data_dir=data_dir) == train
  assert built.stat().st_mtime_ns == mtime
  # Another copy of the data builds into its own config folder.
  other = _write(tmp_path / "other", test=TEST[:1])
  assert len(load_tasks(other, "test", data_dir=data_dir)) == 1
  assert len(list((tmp_path / "tfds" / "gsm8k").iterdir())) == 2


def test_bad_copies_fail_clearly(tmp_path):
  with pytest.raises(FileNotFoundError, match="lacks"):
    load_tasks(tmp_path, "train", data_dir=str(tmp_path / "tfds"))
  manual = _write(tmp_path / "bad", test=[TEST[0], {"question": "q", "answer": "no marker"}])
  with pytest.raises(ValueError, match=r"test.jsonl:2: not a GSM8K record"):
    load_tasks(manual, "test", data_dir=str(tmp_path / "tfds"))
  with pytest.raises(ValueError, match="split must be"):
    load_tasks(manual, "validation")


@pytest.mark.parametrize(
  "text,expected",
  [
    ("48/2 = 24, 48+24 = 72.\n#### 72", "72"),
    ("#### 72 clips #### 73", "73"),  # the last marker counts
    ("So the answer is $3,000.", "3000"),  # no marker: last number
    ("#### 1.250", "1.25"),
    ("#### -3.0", "-3"),
    ("####", None),
    ("no number", None),
    ("It is 10. Then 12 more", "12"),
  ],
)
def test_extract_answer(text, expected):
  assert extract_answer(text) == expected


def test_normalise_number():
  assert normalise_number("$1,000.50") == "1000.5"
  assert normalise_number("72.") == "72"
  assert normalise_number("1e400") == str(10**400)
  assert normalise_number("nan") is None and normalise_number("") is None


def test_env_rewards_with_a_real_tokenizer(tmp_path):
  tok = get_tokenizer(f"hf:{QWEN_TOKENIZER}?bos=<|im_start|>")
  task = load_tasks(_write(tmp_path / "gsm8k"), "train", data_dir=str(tmp_path / "tfds"))[0]
  env = GSM8KEnv(tok)
  with pytest.raises(RuntimeError, match="reset"):
    env.step([])
  assert tok.decode(env.reset(task)) == task.prompt
  for completion, reward, fmt in (
    (" 48+24 = 72\n#### 72", 1.0, True),
    (" so 72 clips", 1.0, False),
    ("#### 71", 0.0, True),
    ("I don't know", 0.0, False),
  ):
    env.reset(task)
    result = env.step(tok.encode(completion, add_eos=True) + tok.encode(" 5"))
    assert result.done and result.reward == reward and result.info["format_ok"] is fmt
    assert result.info["target"] == "72"
