"""Property test: any override of any config field gives either a clean ConfigError or a
run that starts (its setup builds and its programs' shapes and shardings resolve)."""

from __future__ import annotations

import typing

import jax
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sao_jax import config as C
from sao_jax.learner import make_sft_update
from sao_jax.runners.common import programs_for
from sao_jax.setup import make_setup, validate

CFG = "experiments/configs/sao_arith.py:tiny"
# Fields whose value names something outside the config (a module to import, a broker to
# reach, a W&B account, a directory): checked where they are used, not fuzzed here.
SKIP = {"task.family", "task.data_dir", "transport.bootstrap_servers", "mesh.rules"}
KEYS = [k for k in C.config_keys() if k not in SKIP and not k.startswith("logging.")]


def _hint(key: str):
  cls = C.Config
  *sections, leaf = key.split(".")
  for name in sections:
    cls = typing.get_type_hints(cls)[name]
  return typing.get_type_hints(cls)[leaf]


def _values(hint):
  """Plausible values most of the time (so that many cases start), edge values and junk."""
  junk = st.one_of(st.none(), st.text(max_size=6), st.lists(st.integers(-2, 9), max_size=3))
  origin = typing.get_origin(hint) or hint
  if origin is bool:
    plausible, edge = st.booleans(), st.booleans()
  elif origin is int:
    plausible = st.integers(1, 8)
    edge = st.one_of(st.integers(-3, 0), st.integers(-(2**40), 2**40))
  elif origin is float:
    plausible = st.floats(0.01, 1.0)
    edge = st.one_of(st.floats(-3, 0), st.floats(allow_nan=True, allow_infinity=True))
  elif origin is str:
    plausible = st.sampled_from(
      [
        "grpo",
        "sao",
        "decay",
        "drop",
        "token",
        "sequence",
        "tracker",
        "inline",
        "samplers",
        "embedded",
        "off",
        "steps",
        "tokens",
        "char",
        "float32",
        "bfloat16",
        "+-*",
        "+",
      ]
    )
    edge = st.text(max_size=8)
  else:  # tuples
    plausible = st.lists(st.integers(1, 4), max_size=3).map(tuple)
    edge = st.lists(st.one_of(st.integers(-2, 9), st.text(max_size=3)), max_size=4).map(tuple)
  return st.one_of(plausible, plausible, plausible, edge, junk)


@st.composite
def overrides(draw):
  keys = draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=2, unique=True))
  return [(k, draw(_values(_hint(k)))) for k in keys]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
  cfg = C.load_config(CFG)
  return C.override(cfg, "task.data_dir", str(tmp_path_factory.mktemp("tfds")))


@settings(
  max_examples=400,
  deadline=None,
  derandomize=True,
  suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(pairs=overrides())
def test_any_override_is_valid_or_a_one_line_config_error(base, pairs):
  """The config layer alone (fast, many cases): no other exception escapes it."""
  try:
    validate(C.apply_overrides(base, pairs))
  except C.ConfigError as err:
    assert str(err) and "\n" not in str(err), pairs


@settings(
  max_examples=150,
  deadline=None,
  derandomize=True,
  suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(pairs=overrides())
def test_any_override_is_a_config_error_or_a_run_that_starts(base, pairs):
  try:
    cfg = C.apply_overrides(base, pairs)
    s = make_setup(cfg)
    # What a run builds before its first step: mesh, state shapes and their shardings.
    progs = programs_for(s, cfg.sft.optim, make_sft_update)
  except C.ConfigError as err:
    assert str(err) and "\n" not in str(err), pairs
    event("refused")
    return
  event("started")
  assert progs.batch_divisor >= 1
  assert jax.tree.leaves(progs.state_sharding)


def test_every_field_is_fuzzed():
  assert len(KEYS) > 100 and "rl.optim.lr" in KEYS and "eval.num_problems" in KEYS
