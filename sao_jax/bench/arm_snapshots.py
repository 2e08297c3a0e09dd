"""An arm's training saved and restored as Orbax snapshots (`--params-dir` of the compression
experiments): a rerun with the same settings restores the trained parameters instead of
training again, continues a snapshot at fewer steps with the batches one run would have had,
and refuses a snapshot trained under other settings or another resolved configuration."""

from __future__ import annotations

import json
import pathlib

import jax

from sao_jax import checkpoint as ckpt
from sao_jax import config as config_lib
from sao_jax.config import Config
from sao_jax.provenance import cpu, provenance
from sao_jax.runners import memory_lab as L


def _snapshot_settings(key) -> dict:
  """What must match for a snapshot to be reused or continued: the key less the config file's
  path (a frozen copy of the checkout elsewhere holds the same file; the resolved
  configuration is compared instead) and the step count (a snapshot at fewer steps is
  continued, not refused)."""
  return {k: v for k, v in (key or {}).items() if k not in ("config", "steps")}


def train_arm(
  params_dir: str,
  key: dict,
  cfg: Config,
  progs,
  memory: bool,
  train,
  every: int = 100,
  prov: dict | None = None,
  **kw,
):
  """`L.train` for one arm (`kw`: steps, length, seed, log), returning (params, seconds, last
  metrics, origin). With `params_dir` the trained state is saved under params_dir/<task>/<arm>
  as an Orbax snapshot at its step count, whose metadata holds `key` (everything that
  determines the training). A rerun with the same settings restores the snapshot at `steps`
  (checksums verified) with the seconds and metrics of the run that trained it; when the
  folder only has one at fewer steps (k), that state (optimizer and RNG included) is restored
  and trained on to `steps` with the batches a single run would have had, and saved beside
  it. Snapshots are also saved every `every` steps, so a run stopped in its training trains
  on from the last of them. `origin` says where the parameters came from and on which CPU. A
  snapshot saved with other settings or under another resolved configuration is an error,
  not a silent reuse."""
  if not params_dir:
    state, secs, metrics = L.train(cfg, progs, memory, train, **kw)
    return state.params, secs, metrics, None
  where = pathlib.Path(params_dir) / key["task"] / key["arm"]
  steps = kw.get("steps")
  mngr = ckpt.manager(where, every=1, keep=1_000_000, keep_best=False)
  metas = {s: ckpt.read_meta(where, s, mngr)[1] for s in mngr.all_steps()}
  resolved = None
  for meta in metas.values():
    if _snapshot_settings(meta.get("bench_key")) != _snapshot_settings(key):
      mngr.close()
      raise SystemExit(
        f"{where} holds parameters trained with {meta.get('bench_key')}, not {key}: "
        "pass another --params-dir"
      )
    # The resolved configuration too (a config file edited since, under the same path);
    # resolved only once the settings match (`cfg` may be None in a settings mismatch).
    if resolved is None:
      resolved = json.loads(json.dumps(config_lib.to_dict(cfg)))
    saved = config_lib.upgrade(meta.get("config") or {})
    if saved != resolved:
      mngr.close()
      changed = sorted(k for k in resolved if resolved[k] != saved.get(k))
      raise SystemExit(
        f"{where} holds parameters trained under another configuration (differs in "
        f"{changed}): pass another --params-dir"
      )
  log = kw.get("log") or (lambda _: None)
  like = progs.init(jax.random.key(kw.get("seed", 0)))
  if steps in metas:
    mngr.close()
    params, step, meta = ckpt.restore_params(where, like.params, steps)
    log(f"  {key['arm']}: parameters restored from {where} step {step} (not retrained)")
    origin = {
      "restored_from": str(where),
      "step": step,
      "trained_on_cpu": meta.get("cpu"),
      "trained_at_commit": meta.get("commit"),
    }
    if meta.get("continued"):
      origin["continued"] = meta["continued"]
    return params, meta["train_seconds"], meta["final_metrics"], origin
  earlier = max((s for s in metas if s < steps), default=None)
  state, before, origin, parts = None, 0.0, None, []
  if earlier is not None:
    state, _ = ckpt.restore_state(mngr, like, earlier)
    prev = metas[earlier]
    before = prev["train_seconds"]
    parts = prev.get("continued") or [
      {"steps": earlier, "seconds": before, "cpu": prev.get("cpu"), "commit": prev.get("commit")}
    ]
    log(f"  {key['arm']}: continuing from {where} step {earlier} to step {steps}")
  prov = prov or provenance(devices=False)  # the run's, when it passes it in
  here = {"cpu": (prov.get("machine") or {}).get("cpu") or cpu(), "commit": prov.get("commit")}

  def snapshot(state, step: int, secs: float, metrics: dict) -> dict:
    meta = {
      "bench_key": dict(key, steps=step),
      "train_seconds": before + secs,
      "final_metrics": metrics,
      **here,
    }
    if earlier is not None:
      meta["continued"] = [*parts, {"steps": step, "seconds": secs, **here}]
    ckpt.save(mngr, state, cfg, meta, force=True)
    return meta

  try:
    state, secs, metrics = L.train(
      cfg, progs, memory, train, state=state, every=every, on_snapshot=snapshot, **kw
    )
    meta = snapshot(state, steps, secs, metrics)
    mngr.wait_until_finished()
  finally:
    mngr.close()
  if earlier is not None:
    origin = {"continued_from": str(where), "from_step": earlier, "continued": meta["continued"]}
  return state.params, before + secs, metrics, origin
