"""One process of the 2-process learner in tests/test_multihost.py (not a test module).

Started with $SAO_JAX_COORDINATOR, $SAO_JAX_NUM_PROCESSES, $SAO_JAX_PROCESS_ID and 4 fake
CPU devices; joins the others, runs one SFT and one SAO update on the global 8-device mesh
and, on process 0 only, writes loss, grad_norm and the gathered params to OUT/<kind>.npz.
Then it samples greedily from the SAO params (OUT/greedy.npz), publishes them
(ParamPublisher into OUT/params_<i>: only process 0 writes) and saves and restores the
sharded SAO state with Orbax (OUT/ckpt, all processes).
Every process writes OUT/process_<i>.json (its devices, batch rows, what it received from
process 0, restore check) for the test to check.

    python tests/multihost_worker.py OUT
"""

from __future__ import annotations

import json
import pathlib
import sys

from sao_jax import distributed
from sao_jax.config import DistributedConfig

OUT = pathlib.Path(sys.argv[1])
dist = distributed.initialize(DistributedConfig())  # before anything touches a device

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from test_sharding import TOK, _cfg, _rl_batch, _sao_batch, _sft_batch  # noqa: E402

from sao_jax import checkpoint as ckpt_lib  # noqa: E402
from sao_jax.learner import make_sao_update, make_sft_update  # noqa: E402
from sao_jax.models.transformer import TransformerLM  # noqa: E402
from sao_jax.runners.compiled import compile_learner, compile_sampler  # noqa: E402
from sao_jax.sharding import make_mesh  # noqa: E402
from sao_jax.transport.params import ParamPublisher  # noqa: E402

AXES, SHAPE = ("data", "fsdp", "tensor"), (4, 2, 1)


def main():
  cfg = _cfg(AXES, SHAPE)
  mesh = make_mesh(cfg.mesh)
  model = TransformerLM(cfg.model)
  tx = optax.sgd(0.1)
  rl = _rl_batch()
  sft, sao = _sft_batch(rl), _sao_batch(rl)
  info = {
    "process_index": jax.process_index(),
    "process_count": jax.process_count(),
    "devices": len(jax.devices()),
    "local_devices": len(jax.local_devices()),
    "resolved": [dist.coordinator, dist.num_processes, dist.process_id],
  }
  # What process 0 alone holds reaches every process bit for bit (-0.0, NaN, 64-bit ints).
  sent = {
    "f": np.array([-0.0, np.nan, 1.5], np.float32),
    "i": np.int64(2**40 + 3),
    "b": np.array([[True, False]]),
  }
  mine = sent if distributed.is_primary() else jax.tree.map(np.zeros_like, sent)
  got = distributed.from_primary(mine)
  info["from_primary_exact"] = all(
    a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(sent), strict=True)
  )
  info["agree"] = distributed.agree(distributed.is_primary())  # process 0's True everywhere
  cases = {
    "sft": (make_sft_update(model, tx), sft, 0, False),
    "sao": (make_sao_update(model, tx, cfg.rl, cfg.sao), sao, 5, True),
  }
  for kind, (update, batch, num_tasks, local) in cases.items():
    progs = compile_learner(
      cfg, model, tx, update, with_ref=False, prompt_len=40, mesh=mesh, num_tasks=num_tasks
    )
    rows = progs.process_rows(16)
    info[f"{kind}_rows"] = [rows.start, rows.stop]
    if local:  # this process's loader built only its own rows
      batch = progs.shard_batch(jax.tree.map(lambda x, r=rows: np.asarray(x)[r], batch), local=True)
    else:  # every process built the whole batch; each keeps its rows
      batch = progs.shard_batch(batch)
    state = progs.init(jax.random.key(0))
    state, metrics = progs.update(state, batch)
    params = multihost_utils.process_allgather(state.params, tiled=True)  # a collective
    if distributed.is_primary():
      flat = {
        jax.tree_util.keystr(p): np.asarray(v)
        for p, v in jax.tree_util.tree_flatten_with_path(params)[0]
      }
      np.savez(
        OUT / f"{kind}.npz",
        loss=np.asarray(metrics["loss"]),
        grad_norm=np.asarray(metrics["grad_norm"]),
        **flat,
      )
  # Sampling as evaluation does it: host prompts in every process, the whole output back.
  smp = compile_sampler(
    cfg,
    model,
    prompt_len=40,
    max_new_tokens=4,
    temperature=1.0,
    eos_id=TOK.eos_id,
    pad_id=TOK.pad_id,
    mesh=mesh,
  )
  out = smp.greedy(state.params, rl.prompt_bp, rl.prompt_valid_bp, jax.random.key(0))
  if distributed.is_primary():
    np.savez(OUT / "greedy.npz", tokens_bt=out.tokens_bt, logp_bt=out.logp_bt)
  # Every process publishes into its own folder: only process 0's may have files.
  ParamPublisher(OUT / f"params_{jax.process_index()}").publish(1, state.params)
  # An Orbax snapshot of the sharded SAO state, every process saving its shards into one
  # folder, restored onto a fresh state of the same sharding.
  mngr = ckpt_lib.manager(OUT / "ckpt", every=1, keep=1, keep_best=False)
  ckpt_lib.save(mngr, state, cfg, {"note": "multihost"})
  mngr.wait_until_finished()
  restored, meta, step, _ = ckpt_lib.restore_latest_valid(mngr, progs.init(jax.random.key(1)))
  mngr.close()
  diffs = jax.tree.map(
    lambda a, b: float(np.max(np.abs(a - b))),
    params,
    multihost_utils.process_allgather(restored.params, tiled=True),
  )
  tracker = multihost_utils.process_allgather(restored.tracker, tiled=True)
  info["restore"] = {
    "step": step,
    "note": meta["note"],
    "max_diff": max(jax.tree.leaves(diffs)),
    "tracker_sum": float(sum(np.sum(x) for x in jax.tree.leaves(tracker))),
    "params_sharded": not restored.params["block_0"]["attn"]["query"][
      "kernel"
    ].is_fully_addressable,
  }
  (OUT / f"process_{jax.process_index()}.json").write_text(json.dumps(info))


if __name__ == "__main__":
  main()
