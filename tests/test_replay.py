"""`sao-jax replay`'s pieces that need no run: the parameter digest and the refusals. The
end-to-end replay of a crashed and resumed SAO run is in test_faults.py."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao_jax import config as config_lib
from sao_jax import replay
from sao_jax.state import tree_digest


def _tree():
  k = jax.random.split(jax.random.key(0), 3)
  return {
    "w": jax.random.normal(k[0], (16, 24)),
    "b": jax.random.normal(k[1], (24,)).astype(jnp.bfloat16),
    "n": {"s": jax.random.normal(k[2], (7,))},
  }


def test_digest_sees_every_bit_and_not_the_sharding():
  tree = _tree()
  d = int(tree_digest(tree))
  assert d == int(jax.jit(tree_digest)(tree))
  # One bit of one element, anywhere, changes it.
  w = np.asarray(tree["w"]).copy()
  w.view(np.uint32)[3, 5] ^= 1
  assert int(tree_digest(dict(tree, w=jnp.asarray(w)))) != d
  b = np.asarray(tree["b"]).copy()
  b.view(np.uint16)[0] ^= 1 << 15
  assert int(tree_digest(dict(tree, b=jnp.asarray(b)))) != d
  # Swapping two elements (same multiset of bits) changes it too.
  w = np.asarray(tree["w"]).copy()
  w[0, 0], w[0, 1] = w[0, 1], w[0, 0]
  assert int(tree_digest(dict(tree, w=jnp.asarray(w)))) != d
  # The same values split over the fake 8-device mesh give the same digest.
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(8), ("data",))
  sh = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  sharded = dict(tree, w=jax.device_put(tree["w"], sh))
  assert len(sharded["w"].sharding.device_set) == 8
  assert int(jax.jit(tree_digest)(sharded)) == d


def _workdir(tmp_path, cfg, rows):
  (tmp_path / "config.json").write_text(config_lib.to_json(cfg))
  (tmp_path / "ledger.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  return tmp_path


def test_replay_refuses_what_it_cannot_replay_by_name(tmp_path, repo_root):
  from sao_jax.setup import load_config

  sao = load_config(str(repo_root / "experiments/configs/sao_arith.py:tiny"))
  with pytest.raises(replay.ReplayError, match="no config.json"):
    replay.load_run(tmp_path)
  grpo = load_config(str(repo_root / "experiments/configs/arith_grpo.py:tiny"))
  with pytest.raises(replay.ReplayError, match="deterministic from its seed"):
    replay.load_run(_workdir(tmp_path, grpo, []))
  with pytest.raises(replay.ReplayError, match="missing or empty"):
    replay.load_run(_workdir(tmp_path, sao, []))
  old = [{"step": 1, "applied": [1], "stale": []}]
  with pytest.raises(replay.ReplayError, match="keep_journal=True"):
    replay.load_run(_workdir(tmp_path, sao, old))
  check = {"loss": 1.0, "grad_norm": 1.0, "digest": 1}
  gap = [dict(step=s, applied=[s], stale=[], check=check) for s in (1, 3)]
  with pytest.raises(replay.ReplayError, match="1..N"):
    replay.load_run(_workdir(tmp_path, sao, gap))


def test_replay_refuses_another_device_count(tmp_path, repo_root):
  from sao_jax.setup import load_config

  sao = load_config(str(repo_root / "experiments/configs/sao_arith.py:tiny"))
  check = {"loss": 1.0, "grad_norm": 1.0, "digest": 1}
  work = _workdir(tmp_path, sao, [dict(step=1, applied=[1], stale=[], check=check)])
  devices = [f"TFRT_CPU_{i}" for i in range(len(jax.devices()) + 1)]
  (work / "summary.json").write_text(json.dumps({"devices": devices}))
  with pytest.raises(replay.ReplayError, match=f"ran on {len(devices)} devices"):
    replay.replay(work, show_progress=False)
