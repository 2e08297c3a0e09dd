"""Parameter versions and snapshots in a bucket (`storage.url`), against a real HTTP S3
endpoint in its own process (moto's server, the `s3_endpoint` fixture): the parameter
channel's guarantees hold there as on a disk, snapshots are committed with a marker written
last and a resume reads them from the bucket alone, and a learner killed with SIGKILL and
rerun with nothing of its snapshots or parameters on its own disk loses no trajectory and
applies none twice."""

import json
import math
import shutil
import subprocess
import threading
import time

import numpy as np
import orbax.checkpoint as ocp
import pytest
from conftest import kill9_when, subprocess_env, train_cmd

from sao_jax import checkpoint as ckpt
from sao_jax import config as config_lib
from sao_jax import recovery, storage
from sao_jax.metrics import read_jsonl
from sao_jax.transport import auth
from sao_jax.transport.params import ParamPublisher, ParamSubscriber, unflatten


def _tree(x):
  return {"a": {"w": np.full((64, 64), x, np.float32)}, "b": np.arange(4, dtype=np.int32) + x}


def test_storage_url_is_a_bucket_and_never_carries_secrets():
  cfg = config_lib.apply_overrides(config_lib.Config(), ["storage.url=s3://bkt/runs/x"])
  assert cfg.storage.url == "s3://bkt/runs/x"
  for bad in ("/shared/runs", "s3://", "s3://AKIA:secret@bkt/x", "gs://bkt/x?token=1"):
    with pytest.raises(config_lib.ConfigError, match="storage.url"):
      config_lib.apply_overrides(config_lib.Config(), [f"storage.url={bad}"])


def test_endpoint_region_and_credentials_come_from_the_environment(monkeypatch):
  for var in ("AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID"):
    monkeypatch.delenv(var, raising=False)
  monkeypatch.setenv("AWS_ENDPOINT_URL", "http://10.0.0.9:9000")
  spec = storage.kvstore_spec("s3://bkt/runs/x/")
  assert spec == {
    "driver": "s3",
    "bucket": "bkt",
    "path": "runs/x/",
    "endpoint": "http://10.0.0.9:9000",
    "aws_region": "us-east-1",
  }
  monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
  assert storage.kvstore_spec("s3://bkt")["aws_credentials"] == {"type": "environment"}
  assert storage.kvstore_spec("gs://bkt/p") == {"driver": "gcs", "bucket": "bkt", "path": "p/"}


def test_parameter_versions_through_the_bucket(s3_bucket):
  """Round trip, rotation, a new lineage, the run key's tags, and a damaged object."""
  url = f"{s3_bucket}/run/params"
  key = auth.new_key()
  pub, sub = ParamPublisher(url, keep=2, key=key), ParamSubscriber(url, key=key)
  assert sub.poll((-1, -1)) is None and sub.announced() is None
  for v in range(4):
    pub.publish(v, _tree(v), lineage=0xA)
  lineage, version, flat = sub.poll((-1, -1))
  assert (lineage, version) == (0xA, 3) and unflatten(_tree(0), flat)["b"].tolist() == [3, 4, 5, 6]
  store = storage.open_store(url)
  assert store.list() == [
    "LATEST",
    "params_00000000000a_v00000002.npz",
    "params_00000000000a_v00000003.npz",
  ]
  assert ParamSubscriber(url).poll((-1, -1))[:2] == (0xA, 3)  # a reader without the key
  # Someone who can write the bucket but lacks the key: not taken; the older intact one is.
  store.write("params_00000000000a_v00000003.npz", store.read("params_00000000000a_v00000002.npz"))
  with pytest.warns(RuntimeWarning, match="damaged"):
    assert ParamSubscriber(url, key=key).poll((-1, -1))[:2] == (0xA, 2)
  resumed = ParamPublisher(url, keep=2, key=key)  # a restarted learner: a new lineage
  resumed.publish(2, _tree(20), lineage=0xB)
  assert sub.poll((0xA, 3))[:2] == (0xB, 2)


def test_a_reader_never_sees_half_a_version(s3_bucket):
  """While one thread publishes versions of 1 MB, another polls as fast as it can: every
  version it takes is whole and consistent, and the versions it sees only go forward."""
  url = f"{s3_bucket}/params"
  pub, sub = ParamPublisher(url, keep=2), ParamSubscriber(url)
  big = {"w": np.zeros((512, 512), np.float32)}
  done, seen, errors = threading.Event(), [], []

  def read():
    current, deadline = (-1, -1), time.time() + 60
    while (not done.is_set() or current[1] < 19) and time.time() < deadline:
      got = sub.poll(current)
      if got is None:
        time.sleep(0.005)
        continue
      *current, flat = got
      current = tuple(current)
      w = flat["['w']"]
      if not (w == current[1]).all():
        errors.append(current)
      seen.append(current[1])

  reader = threading.Thread(target=read)
  reader.start()
  for v in range(20):
    pub.publish(v, {"w": big["w"] + v}, lineage=1)
  done.set()
  reader.join(timeout=60)
  assert not reader.is_alive() and not errors and not sub.damaged
  assert seen == sorted(seen) and seen[-1] == 19 and len(seen) >= 2


def _save(mngr, step: int):
  tree = {"w": np.full((8, 8), step, np.float32)}
  mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(tree)))


def _restore(mngr, step: int):
  like = {"w": np.zeros((8, 8), np.float32)}
  out = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(like)))
  return float(out["state"]["w"][0, 0])


def test_snapshots_are_committed_to_the_bucket_and_restored_from_it(tmp_path, s3_bucket):
  url = f"{s3_bucket}/run/checkpoints/rl"
  local = tmp_path / "checkpoints" / "rl"
  mngr = ckpt.manager(local, every=1, keep=2, keep_best=False, remote=url)
  for step in range(4):
    _save(mngr, step)
    while mngr.is_saving_in_progress():  # until the bucket holds it
      time.sleep(0.02)
    assert step in ckpt.Mirror.committed(mngr.mirror)
  mngr.close()
  store = storage.open_store(url)
  assert sorted(n for n in store.list() if n.endswith(".commit")) == ["2.commit", "3.commit"]
  marker = json.loads(store.read("3.commit"))
  assert all(store.read(f"3/{rel}") for rel in marker["files"])

  # A crash while step 4 was being uploaded left objects without a marker; the learner's
  # disk is gone. A new manager restores the bucket's committed steps and only those.
  store.write("4/state/garbage", b"half an upload")
  shutil.rmtree(tmp_path / "checkpoints")
  mngr = ckpt.manager(local, every=1, keep=2, keep_best=False, remote=url)
  assert sorted(mngr.all_steps()) == [2, 3] and _restore(mngr, 3) == 3.0
  assert not [n for n in store.list() if n.startswith("4/")]

  # A committed object damaged in the bucket: that step is not restored from, the one
  # before it is; the next push drops the damaged one there too.
  name = next(f"3/{rel}" for rel in json.loads(store.read("3.commit"))["files"])
  store.write(name, b"\0" + store.read(name)[1:])
  mngr.close()
  with pytest.warns(RuntimeWarning, match="step 3 .* unreadable"):
    mngr = ckpt.manager(local, every=1, keep=2, keep_best=False, remote=url)
  assert sorted(mngr.all_steps()) == [2] and _restore(mngr, 2) == 2.0
  mngr.wait_until_finished()
  assert sorted(n for n in store.list() if n.endswith(".commit")) == ["2.commit"]
  mngr.close()


def test_an_unreachable_bucket_is_a_clear_error(tmp_path, monkeypatch):
  from sao_jax.transport.broker import free_port

  monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
  monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
  monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
  t = time.time()
  with pytest.raises(storage.StoreError, match="s3://nowhere/x"):
    storage.open_store("s3://nowhere/x").list()
  assert time.time() - t < 30
  assert ParamSubscriber("s3://nowhere/x").poll((-1, -1)) is None  # a sampler tries again


CFG = "experiments/configs/sao_arith.py:tiny"
STEPS = 36


def _committed_steps(url: str) -> list[int]:
  names = storage.open_store(storage.join(url, "checkpoints", "rl")).list()
  return sorted(int(n[: -len(".commit")]) for n in names if n.endswith(".commit"))


@pytest.mark.slow
def test_kill_9_and_resume_with_snapshots_and_parameters_only_in_the_bucket(
  repo_root, tmp_path, s3_bucket
):
  """The learner's snapshots and parameter versions go only to the bucket; it is killed with
  SIGKILL after a snapshot and updates beyond it, its local snapshot folder is deleted (a
  fresh disk), and the same command resumes from the bucket: the run finishes and its books
  show no trajectory lost, none applied twice."""
  url = f"{s3_bucket}/runs/tiny"
  workdir = tmp_path / "w"
  cmd = train_cmd(CFG, workdir) + [
    *("--set", f"rl.steps={STEPS}", "--set", "checkpoint_every=8", "--set", "log_every=1"),
    *("--set", "recovery.shadow_every=10", "--set", "recovery.val_problems=32"),
    *("--set", "recovery.keep_journal=True", "--set", f"storage.url={url}"),
  ]
  ledger = workdir / "ledger.jsonl"

  def ready() -> bool:  # a snapshot after step 0 in the bucket, and two updates past it
    done = ledger.read_text().count("\n") if ledger.exists() else 0
    committed = [s for s in _committed_steps(url) if s > 0] if done > 8 else []
    return bool(committed) and done >= committed[-1] + 2

  kill9_when(cmd, ready, timeout_s=300, poll=0.2)
  killed_at = ledger.read_text().count("\n")
  in_bucket = _committed_steps(url)
  assert not (workdir / "params").exists()  # parameters went only to the bucket
  shutil.rmtree(workdir / "checkpoints")  # nothing of the snapshots left on this disk

  out = subprocess.run(
    cmd, cwd=repo_root, env=subprocess_env(), capture_output=True, text=True, timeout=600
  )
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  rl = json.loads((workdir / "summary.json").read_text())["rl"]
  assert rl["steps"] == STEPS and rl["resumes"] == 1 and math.isfinite(rl["accuracy"])
  resume = next(r for r in read_jsonl(workdir / "metrics.jsonl") if r.get("event") == "resume")
  assert resume["from_step"] == in_bucket[-1] < killed_at, (resume, in_bucket, killed_at)
  _, meta = ckpt.read_meta(workdir / "checkpoints" / "rl")
  audit = recovery.audit(workdir, meta["stream"]["journal_next"])
  print(f"object-storage kill -9 at {killed_at} updates, resumed from {resume['from_step']}:")
  print(json.dumps({k: audit[k] for k in ("consumed", "applied", "lost", "applied_twice")}))
  assert audit["lost"] == 0 and audit["applied_twice"] == 0 and audit["not_consumed"] == 0, audit
  assert audit["steps_contiguous"] and audit["discarded_lineage_applied"] == 0, audit
  assert audit["applied"] + audit["stale"] == audit["consumed"]
  assert audit["applied"] == rl["trajectories"]
  assert STEPS in _committed_steps(url) and not (workdir / "params").exists()
  assert storage.open_store(storage.join(url, "params")).read("LATEST")
