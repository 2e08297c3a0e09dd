import dataclasses
import json

import pytest

from sao_jax import config as C
from sao_jax.setup import validate

CFG = "experiments/configs/arith_grpo.py"


def test_override_nested_and_types():
  cfg = C.apply_overrides(
    C.Config(),
    ["rl.optim.lr=3e-5", "model.depth=4", "task.ops='+-*'", "rl.clip_eps=0.1", "sft.max_seconds=5"],
  )
  assert cfg.rl.optim.lr == 3e-5 and cfg.model.depth == 4 and cfg.task.ops == "+-*"
  assert cfg.rl.clip_eps == 0.1 and cfg.sft.max_seconds == 5.0
  assert isinstance(cfg.sft.max_seconds, float)


@pytest.mark.parametrize(
  "pair, match",
  [
    ("rl.bogus=1", "unknown config key 'rl.bogus' in RLConfig"),
    ("nope=1", "unknown config key 'nope' in Config"),
    ("model.depth=two", "cannot parse"),
    ("model.depth=2.5", "expects int"),
    ("model.width", "key=value"),
    ("seed.x=1", "is a value, not a section"),
    ("model.width=130", "not divisible by heads"),
    ("rl.advantage='nope'", "rl.advantage 'nope' unknown"),
    ("rl.advantage='spo_tracker'", "not a group estimator, which GRPO needs"),
    ("rl.loss='nope'", "rl.loss 'nope' unknown"),
    ("rl.clip_eps=1.5", "clip_eps"),
    ("rl.lr=1e-3", "did you mean 'rl.optim.lr'"),
    ("sao.max_stalenes=2", "did you mean 'sao.max_staleness'"),
    ("eval.num_problems=0", "eval.num_problems and eval.batch_size must be >= 1"),
    ("rl.max_seconds=-5", "rl.steps and rl.max_seconds must be >= 0"),
    ("sft.optim.lr=0", "sft.optim.lr must be > 0"),
    ("rl.optim.b2=1.0", r"rl.optim.b2 must be in \(0, 1\)"),
    ("task.n_ops=9", r"task.n_ops must be an int in 1..4"),
    ("model.vocab_size=-1", "model.vocab_size must be >= 0"),
    ("model.mlp_ratio=0", "mlp_ratio must be positive"),  # was a ZeroDivisionError in init
    ("sft.steps=3000000000", "does not fit in int32"),
    ("name=''", "name must not be empty"),
    ("init_from='/nowhere/ckpt'", "no such checkpoint directory"),
  ],
)
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
  for pairs in (
    ["task.num_test=200", "eval.num_problems=200"],
    ["eval.num_problems=200", "task.num_test=200"],
  ):
    cfg = C.apply_overrides(C.Config(), pairs)
    assert cfg.task.num_test == 200 and cfg.eval.num_problems == 200
  for pairs in (["task.num_test=200"], ["eval.num_problems=900"]):
    with pytest.raises(C.ConfigError, match="eval.num_problems"):
      C.apply_overrides(C.Config(), pairs)
  with pytest.raises(C.ConfigError, match="is a section"):
    C.apply_overrides(C.Config(), ["rl=1"])


def test_non_finite_floats_are_refused():
  with pytest.raises(C.ConfigError, match="rl.optim.lr must be > 0|lr must be finite"):
    dataclasses.replace(
      C.Config(), rl=dataclasses.replace(C.RLConfig(), optim=C.OptimConfig(lr=float("nan")))
    )
  with pytest.raises(C.ConfigError, match="sao.is_cap must be finite"):
    dataclasses.replace(C.Config(), sao=C.SAOConfig(is_cap=float("inf")))


def test_task_space_too_small_is_a_config_error(tmp_path):
  from sao_jax.setup import make_setup

  cfg = C.apply_overrides(
    C.load_config(f"{CFG}:tiny"),
    ["task.n_ops=1", "task.max_operand=5", f"task.data_dir='{tmp_path}'"],
  )
  with pytest.raises(C.ConfigError, match="task family 'arithmetic': the test split covers"):
    make_setup(cfg)


def test_a_refused_config_leaves_the_workdir_untouched(tmp_path):
  from sao_jax.runners.run import run

  cfg = C.apply_overrides(C.load_config(f"{CFG}:tiny"), ["model.vocab_size=3"])
  with pytest.raises(C.ConfigError, match="model.vocab_size 3 <"):
    run(cfg, tmp_path / "w", show_progress=False)
  assert not (tmp_path / "w").exists()


def test_moved_keys_are_refused_by_name_and_old_configs_read_back():
  """The sampler-process settings left `sao` for `samplers`: the old key on the command line
  says where it went; a config saved before the move reads back to the same config."""
  with pytest.raises(C.ConfigError, match="'sao.pin_cores' moved: it is 'samplers.pin_cores'"):
    C.apply_overrides(C.Config(), ["sao.pin_cores=True"])
  cfg = C.apply_overrides(C.Config(), ["samplers.num=3", "samplers.quarantine_rate=0.25"])
  old = C.to_dict(cfg)
  old["sao"].update(num_samplers=3, quarantine_rate=0.25, sampler_threads=0)
  del old["samplers"]
  assert C.from_saved(json.loads(json.dumps(old))) == cfg
  assert set(C.MOVED.values()) <= set(C.config_keys())
  assert not set(C.MOVED) & set(C.config_keys())


def test_read_saved_reads_an_old_workdir_config_and_refuses_unknown_keys(tmp_path):
  """A workdir's config.json from before a field existed reads back with the field at its
  default; one with a key this code does not know is refused by name."""
  cfg = C.apply_overrides(C.Config(), ["rl.optim.lr=0.0003"])
  old = C.to_dict(cfg)
  del old["samplers"]["quarantine_rate"]
  (tmp_path / "config.json").write_text(json.dumps(old))
  assert C.read_saved(tmp_path / "config.json") == cfg
  (tmp_path / "bad.json").write_text(json.dumps(dict(old, gone=1)))
  with pytest.raises(C.ConfigError, match="unknown config key 'gone'"):
    C.read_saved(tmp_path / "bad.json")
