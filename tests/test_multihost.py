"""A learner over 2 processes x 4 CPU devices (jax.distributed, gloo) == the same update on
one process's 8 devices; the distributed config and its environment variables."""

import json
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import optax
import pytest
from conftest import REPO_ROOT, subprocess_env
from test_sharding import (
  LOSS_RTOL,
  PARAM_ATOL,
  TOK,
  _cfg,
  _one_update,
  _rl_batch,
  _sao_batch,
  _sft_batch,
)

from sao_jax import distributed
from sao_jax.config import Config, ConfigError, DistributedConfig, override
from sao_jax.learner import make_sao_update, make_sft_update
from sao_jax.models.transformer import TransformerLM
from sao_jax.runners.compiled import compile_sampler
from sao_jax.sharding import batch_sharding, make_mesh, process_rows, put_batch

WORKER = REPO_ROOT / "tests" / "multihost_worker.py"


def test_distributed_config_from_fields_and_environment():
  assert distributed.resolve(DistributedConfig(), {}) == DistributedConfig()  # one process
  env = {
    "SAO_JAX_COORDINATOR": "10.0.0.1:1234",
    "SAO_JAX_NUM_PROCESSES": "4",
    "SAO_JAX_PROCESS_ID": "3",
  }
  assert distributed.resolve(DistributedConfig(), env) == DistributedConfig(
    coordinator="10.0.0.1:1234", num_processes=4, process_id=3
  )
  # A field set in the config wins over the environment.
  got = distributed.resolve(DistributedConfig(process_id=0), env)
  assert (got.coordinator, got.num_processes, got.process_id) == ("10.0.0.1:1234", 4, 0)
  assert distributed.resolve(DistributedConfig(coordinator="auto"), {}).coordinator == "auto"
  with pytest.raises(ConfigError, match="needs distributed.num_processes"):
    distributed.resolve(DistributedConfig(coordinator="h:1"), {})
  with pytest.raises(ConfigError, match="needs distributed.coordinator"):
    distributed.resolve(DistributedConfig(num_processes=2, process_id=0), {})
  with pytest.raises(ConfigError, match=r"\$SAO_JAX_PROCESS_ID='x' is not an integer"):
    distributed.resolve(DistributedConfig(), dict(env, SAO_JAX_PROCESS_ID="x"))
  with pytest.raises(ConfigError, match="must be < num_processes"):
    distributed.resolve(DistributedConfig(), dict(env, SAO_JAX_PROCESS_ID="4"))
  for bad in ("nohostport", "h:0", "h:70000", ":5", "h:"):
    with pytest.raises(ConfigError, match="must be 'host:port'"):
      override(Config(), "distributed.coordinator", bad)
  assert override(Config(), "distributed.num_processes", 2).distributed.num_processes == 2
  # No coordinator: nothing to join, and JAX is left single-process.
  assert distributed.initialize(DistributedConfig(), {}) == DistributedConfig()
  assert jax.process_count() == 1 and distributed.is_primary()


def test_single_process_batch_is_all_rows_and_a_device_put():
  cfg = _cfg(("data", "fsdp", "tensor"), (4, 2, 1))
  sh = batch_sharding(make_mesh(cfg.mesh), cfg.mesh.rules)
  assert process_rows(sh, 16) == slice(0, 16)
  batch = _rl_batch()
  for local in (False, True):
    out = put_batch(batch, sh, local=local)
    assert out.tokens_bt.sharding == sh
    np.testing.assert_array_equal(np.asarray(out.tokens_bt), batch.tokens_bt)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _run_workers(out, n=2, timeout=600):
  port = _free_port()
  procs = []
  try:
    for i in range(n):
      env = dict(
        subprocess_env(),
        XLA_FLAGS="--xla_force_host_platform_device_count=4",
        JAX_PLATFORMS="cpu",
        SAO_JAX_COORDINATOR=f"127.0.0.1:{port}",
        SAO_JAX_NUM_PROCESSES=str(n),
        SAO_JAX_PROCESS_ID=str(i),
      )
      log = open(out / f"log_{i}.txt", "w")  # noqa: SIM115 (closed below)
      procs.append(
        (
          subprocess.Popen(
            [sys.executable, str(WORKER), str(out)],
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
          ),
          log,
        )
      )
    deadline = time.time() + timeout
    for p, _ in procs:
      p.wait(timeout=max(deadline - time.time(), 1))
  finally:
    for p, log in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
      log.close()
  for i, (p, _) in enumerate(procs):
    assert p.returncode == 0, (out / f"log_{i}.txt").read_text()[-3000:]


@pytest.mark.slow
def test_two_processes_equal_one_process(tmp_path):
  t0 = time.time()
  _run_workers(tmp_path)
  wall = time.time() - t0
  infos = [json.loads((tmp_path / f"process_{i}.json").read_text()) for i in range(2)]
  for i, info in enumerate(infos):
    assert (info["process_index"], info["process_count"]) == (i, 2)
    assert (info["devices"], info["local_devices"]) == (8, 4)
    assert info["resolved"][1:] == [2, i]
    # Batch axis (data, fsdp) = 8 devices, 4 per process: each feeds half the rows.
    assert info["sft_rows"] == info["sao_rows"] == [8 * i, 8 * i + 8]
    # The Orbax snapshot that both processes saved restores exactly, still sharded.
    restore = info["restore"]
    assert (restore["step"], restore["note"], restore["max_diff"]) == (1, "multihost", 0.0)
    assert restore["params_sharded"] and restore["tracker_sum"] > 0
  # Only the primary process publishes parameters, and what it publishes is the whole state.
  assert not (tmp_path / "params_1").exists()
  latest = json.loads((tmp_path / "params_0" / "LATEST").read_text())
  published = np.load(tmp_path / "params_0" / latest["file"])
  sao_npz = np.load(tmp_path / "sao.npz")
  assert latest["version"] == 1 and len(published.files) == len(sao_npz.files) - 2
  for k in published.files:
    np.testing.assert_array_equal(published[k], sao_npz[k])
  cfg = _cfg(("data", "fsdp", "tensor"), (4, 2, 1))
  mesh = make_mesh(cfg.mesh)
  tx = optax.sgd(0.1)
  rl = _rl_batch()
  sft, sao = _sft_batch(rl), _sao_batch(rl)
  cases = {
    "sft": (make_sft_update, sft, 0),
    "sao": (lambda m, t: make_sao_update(m, t, cfg.rl, cfg.sao), sao, 5),
  }
  for kind, (make, batch, num_tasks) in cases.items():
    _, params, metrics = _one_update(cfg, mesh, tx, batch, make, num_tasks)
    got = np.load(tmp_path / f"{kind}.npz")
    np.testing.assert_allclose(got["loss"], metrics["loss"], rtol=LOSS_RTOL)
    np.testing.assert_allclose(got["grad_norm"], metrics["grad_norm"], rtol=LOSS_RTOL)
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    assert len(got.files) == len(flat) + 2
    for path, value in flat:
      np.testing.assert_allclose(got[jax.tree_util.keystr(path)], value, atol=PARAM_ATOL)
  # Greedy sampling from the SAO params (evaluation's path) gives the same completions.
  smp = compile_sampler(
    cfg,
    TransformerLM(cfg.model),
    prompt_len=40,
    max_new_tokens=4,
    temperature=1.0,
    eos_id=TOK.eos_id,
    pad_id=TOK.pad_id,
    mesh=mesh,
  )
  out = jax.device_get(smp.greedy(params, rl.prompt_bp, rl.prompt_valid_bp, jax.random.key(0)))
  greedy = np.load(tmp_path / "greedy.npz")
  np.testing.assert_array_equal(greedy["tokens_bt"], out.tokens_bt)
  np.testing.assert_allclose(greedy["logp_bt"], out.logp_bt, atol=1e-5)
  print(f"2-process learner: {wall:.1f} s for both workers", file=sys.stderr)
