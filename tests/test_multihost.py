"""A learner over 2 processes x 4 CPU devices (jax.distributed, gloo) == the same update on
one process's 8 devices; the distributed config and its environment variables; the SAO
learner over 2 processes (one trajectory intake, in process 0), and a kill -9 of one of them
followed by a restart of both."""

import contextlib
import json
import pathlib
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import optax
import pytest
from conftest import REPO_ROOT, subprocess_env, train_cmd
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

from sao_jax import checkpoint as ckpt
from sao_jax import distributed, recovery
from sao_jax.config import Config, ConfigError, DistributedConfig, override
from sao_jax.learner import make_sao_update, make_sft_update
from sao_jax.metrics import read_jsonl
from sao_jax.models.transformer import TransformerLM
from sao_jax.procs import alive, descendants
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


def _start(cmd, logs, port, n=2) -> list[subprocess.Popen]:
  """`cmd` as process i of n (4 fake CPU devices each), its output in `logs`_i.txt."""
  procs = []
  for i in range(n):
    env = dict(
      subprocess_env(),
      # The suite's compiler flags (conftest) with 4 fake devices: these programs compile
      # in each of the processes, on the same 2 cores.
      XLA_FLAGS=f"{subprocess_env()['XLA_FLAGS']} --xla_force_host_platform_device_count=4",
      JAX_PLATFORMS="cpu",
      SAO_JAX_COORDINATOR=f"127.0.0.1:{port}",
      SAO_JAX_NUM_PROCESSES=str(n),
      SAO_JAX_PROCESS_ID=str(i),
    )
    with open(f"{logs}_{i}.txt", "w") as log:
      procs.append(
        subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
      )
  return procs


def _stop(procs) -> None:
  for p in procs:
    if p.poll() is None:
      p.kill()
      p.wait()


def _check_exit(procs, logs) -> None:
  for i, p in enumerate(procs):
    assert p.returncode == 0, pathlib.Path(f"{logs}_{i}.txt").read_text()[-3000:]


def _run_workers(out, n=2, timeout=600):
  procs = _start([sys.executable, str(WORKER), str(out)], out / "log", _free_port(), n)
  try:
    deadline = time.time() + timeout
    for p in procs:
      p.wait(timeout=max(deadline - time.time(), 1))
  finally:
    _stop(procs)
  _check_exit(procs, out / "log")


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
    assert info["from_primary_exact"] and info["agree"] is True
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


# The SAO learner over 2 processes x 4 devices: process 0 alone runs the samplers and the
# trajectory intake and sends each batch to process 1 (sao_jax.runners.sao).
SAO_STEPS = 8
SAMPLERS = 1


def _sao_cmd(workdir, steps):
  sets = {
    "rl.steps": steps,
    "sft.steps": 1,
    "checkpoint_every": 2,
    "log_every": 1,
    "recovery.keep_journal": True,
    "recovery.shadow_every": 4,
    "recovery.val_problems": 16,
    "eval.num_problems": 16,
    "eval.batch_size": 16,
    "transport.kind": "embedded",
    "samplers.num": SAMPLERS,
    "sao.sampler_slots": 16,
  }
  return train_cmd(
    "experiments/configs/sao_arith.py:tiny", workdir, [f"{k}={v}" for k, v in sets.items()]
  )


def _ledger_steps(workdir) -> int:
  path = workdir / "ledger.jsonl"
  return path.read_text().count("\n") if path.exists() else 0


def _watch(procs, logs, until=None, timeout=600) -> list[set[int]]:
  """Waits for every process to exit (or for `until()`); fails at once if one fails. Returns
  the sampler processes seen under each learner process meanwhile."""
  samplers = [set() for _ in procs]
  deadline = time.time() + timeout
  while not (until() if until else all(p.poll() is not None for p in procs)):
    for i, p in enumerate(procs):
      assert p.poll() in (None, 0), pathlib.Path(f"{logs}_{i}.txt").read_text()[-3000:]
      for pid in descendants(p.pid):
        with contextlib.suppress(OSError):
          if b"spawn_main" in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes():
            samplers[i].add(pid)
    assert time.time() < deadline, "no progress"
    time.sleep(0.2)
  return samplers


def _check_sao_run(workdir, steps, primary_pids) -> dict:
  """A finished run: one metrics row per step, 8 devices, an event log written by process 0
  only, and the journal/ledger audit of the final lineage clean."""
  summary = json.loads((workdir / "summary.json").read_text())
  rl = summary["rl"]
  assert rl["steps"] == steps and len(summary["devices"]) == 8
  assert rl["trajectories"] >= steps and rl["sampler_restarts"] == 0
  rows = [r for r in read_jsonl(workdir / "metrics.jsonl") if r["phase"] == "rl" and "loss" in r]
  assert sorted({r["step"] for r in rows}) == list(range(1, steps + 1))
  assert all(np.isfinite(r["loss"]) for r in rows)
  events = recovery.EventLog.rows(workdir / "events.jsonl")
  assert {r["pid"] for r in events} == set(primary_pids), events
  _, meta = ckpt.read_meta(workdir / "checkpoints" / "rl")
  audit = recovery.audit(workdir, meta["stream"]["journal_next"])
  assert audit["lost"] == audit["applied_twice"] == audit["not_consumed"] == 0, audit
  assert audit["steps_contiguous"] and audit["applied"] == rl["trajectories"], audit
  return rl


@pytest.mark.slow
def test_kill_9_one_learner_process_and_restart_both(tmp_path):
  """The SAO learner over two processes, then kill -9 of one of them. Each run: one sampler
  group (process 0's), one ledger, one journal; process 1 gets every batch from process 0 and
  both take the same updates. kill -9 process 1 after the step-2 snapshot; process 0 cannot go
  on (every update is a collective over both), so it is stopped too, and its sampler exits by
  itself. The same command in both processes resumes from the last snapshot and finishes:
  nothing lost, nothing applied twice. (One test for both: a clean two-process run is the
  second half of this one, and it cost a minute of CI on its own.)"""
  t0 = time.time()
  workdir, port = tmp_path / "w", _free_port()
  cmd = _sao_cmd(workdir, SAO_STEPS)
  first = _start(cmd, tmp_path / "first", port)
  try:
    samplers = _watch(
      first,
      tmp_path / "first",
      until=lambda: _ledger_steps(workdir) >= 3 and (workdir / "checkpoints/rl/2").is_dir(),
    )
    assert len(samplers[0]) == SAMPLERS and not samplers[1], samplers
    children = [c for p in first for c in descendants(p.pid)]
    assert children
    first[1].send_signal(signal.SIGKILL)
    first[1].wait()
    try:  # process 0 fails at its next collective, or waits in it: stopped either way
      first[0].wait(timeout=5)
    except subprocess.TimeoutExpired:
      first[0].kill()
      first[0].wait()
    deadline = time.time() + 30
    while any(alive(c) for c in children) and time.time() < deadline:
      time.sleep(0.2)
    assert not [c for c in children if alive(c)], "orphans left after kill -9"
  finally:
    _stop(first)
  snaps = sorted(ckpt.manager(workdir / "checkpoints" / "rl").all_steps())
  assert snaps[-1] >= 2 and _ledger_steps(workdir) < SAO_STEPS
  second = _start(cmd, tmp_path / "second", port)
  try:
    samplers = _watch(second, tmp_path / "second")
  finally:
    _stop(second)
  _check_exit(second, tmp_path / "second")
  assert len(samplers[0]) == SAMPLERS and not samplers[1], samplers
  rl = _check_sao_run(workdir, SAO_STEPS, [first[0].pid, second[0].pid])
  assert rl["resumes"] == 1
  life = rl["lifetime"]
  assert life["incarnations"] == 2 and life["killed"] == 1 and life["resumes"] == 1, life
  resume = [r for r in read_jsonl(workdir / "metrics.jsonl") if r.get("event") == "resume"]
  assert [r["from_step"] for r in resume] == [snaps[-1]], (snaps, resume)
  print(f"2-process SAO kill -9 and restart: {time.time() - t0:.1f} s", file=sys.stderr)
