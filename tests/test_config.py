import dataclasses

import pytest

from sao_jax import config as C
from sao_jax.setup import validate

CFG = "experiments/configs/arith_grpo.py"


def test_override_nested_and_types():
  cfg = C.apply_overrides(C.Config(), ["rl.optim.lr=3e-5", "model.depth=4", "task.ops='+-*'",
                                       "rl.clip_eps=0.1", "sft.max_seconds=5"])
  assert cfg.rl.optim.lr == 3e-5 and cfg.model.depth == 4 and cfg.task.ops == "+-*"
  assert cfg.rl.clip_eps == 0.1 and cfg.sft.max_seconds == 5.0
  assert isinstance(cfg.sft.max_seconds, float)


@pytest.mark.parametrize("pair, match", [
    ("rl.bogus=1", "unknown config key 'bogus' in RLConfig"),
    ("nope=1", "unknown config key 'nope' in Config"),
    ("model.depth=two", "cannot parse"),
    ("model.depth=2.5", "expects int"),
    ("model.width", "key=value"),
    ("seed.x=1", "is a value, not a section"),
    ("model.width=130", "not divisible by heads"),
    ("rl.advantage='nope'", "rl.advantage 'nope' unknown"),
    ("rl.loss='nope'", "rl.loss 'nope' unknown"),
    ("rl.clip_eps=1.5", "clip_eps"),
])
def test_bad_overrides_are_clear_errors(pair, match):
  with pytest.raises(C.ConfigError, match=match):
    validate(C.apply_overrides(C.Config(), [pair]))  # registry names: checked at validation


def test_load_config_variants_and_roundtrip():
  tiny = C.load_config(f"{CFG}:tiny")
  default = C.load_config(CFG)
  assert tiny.model.width < default.model.width
  assert tiny.name.endswith("tiny")
  again = C.from_dict(C.to_dict(tiny))
  assert again == tiny
  with pytest.raises(ValueError, match="unknown variant"):
    C.load_config(CFG, "huge")
  with pytest.raises(C.ConfigError, match="not found"):
    C.load_config("nowhere.py")


def test_from_dict_rejects_unknown_keys():
  d = C.to_dict(C.Config())
  d["model"]["extra"] = 1
  with pytest.raises(C.ConfigError, match="extra"):
    C.from_dict(d)


def test_eval_must_fit_test_split():
  with pytest.raises(C.ConfigError, match="num_test"):
    dataclasses.replace(C.Config(), eval=C.EvalConfig(num_problems=10_000))


def test_every_config_file_documents_its_command():
  import pathlib
  for path in pathlib.Path("experiments/configs").glob("*.py"):
    text = path.read_text()
    # Configs for `sao-jax train`, or for an experiment script that loads them (longhorizon).
    assert "sao-jax train --config" in text or "python experiments/" in text, path
    assert C.load_config(str(path), "tiny").name


def test_overrides_are_validated_once_in_any_order():
  """A combination valid only together is accepted whatever the order; an invalid result
  is refused whatever the order."""
  for pairs in (["task.num_test=200", "eval.num_problems=200"],
                ["eval.num_problems=200", "task.num_test=200"]):
    cfg = C.apply_overrides(C.Config(), pairs)
    assert cfg.task.num_test == 200 and cfg.eval.num_problems == 200
  for pairs in (["task.num_test=200"], ["eval.num_problems=900"]):
    with pytest.raises(C.ConfigError, match="eval.num_problems"):
      C.apply_overrides(C.Config(), pairs)
  with pytest.raises(C.ConfigError, match="is a section"):
    C.apply_overrides(C.Config(), ["rl=1"])
