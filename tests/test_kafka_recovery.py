"""Over a real broker that outlives the learner: the learner and sampler roles started
separately, and at-least-once delivery from committed offsets after a learner kill -9."""

import json
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest
from conftest import subprocess_env

from sao_jax.recovery import Ledger
from sao_jax.transport.kafka import committed_offsets, topic_record_ids

pytestmark = pytest.mark.slow
CFG = "experiments/configs/sao_arith.py:tiny"


def _popen(args, repo_root):
  return subprocess.Popen(
    [sys.executable, "-m", "sao_jax.cli", *args],
    cwd=repo_root,
    env=subprocess_env(),
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )


def _stop(*procs):
  for p in procs:
    if p.poll() is None:
      p.kill()
      p.wait()


def test_learner_and_sampler_roles_started_separately(tls_broker, repo_root, tmp_path):
  """The two roles as on two machines: the broker reachable only over TLS, the sampler with
  a copy of the run's key and its own TLS settings. The run completes; a sampler without the
  key does not see the run at all."""
  from sao_jax.transport import auth

  address, cert = tls_broker
  run_id = f"roles-{uuid.uuid4().hex[:8]}"
  key_copy = tmp_path / "copy" / auth.KEY_FILE  # made first, copied as an operator would
  auth.load_or_create(tmp_path / "w")
  key_copy.parent.mkdir()
  shutil.copy(tmp_path / "w" / auth.KEY_FILE, key_copy)
  tls = ["--set", "transport.security_protocol=SSL", "--set", f"transport.ssl_cafile={cert}"]
  learner = _popen(
    [
      "learner",
      "--config",
      CFG,
      "--workdir",
      str(tmp_path / "w"),
      "--no-progress",
      "--set",
      f"transport.bootstrap_servers={address}",
      "--set",
      f"transport.run_id={run_id}",
      "--set",
      "rl.steps=8",
      *tls,
    ],
    repo_root,
  )
  role = ["sampler", "--bootstrap", address, "--run-id", run_id]
  role += ["--security-protocol", "SSL", "--ssl-cafile", str(cert)]
  sampler = _popen([*role, "--num", "2", "--wait", "120", "--key-file", str(key_copy)], repo_root)
  try:
    keyless = subprocess.run(
      [sys.executable, "-m", "sao_jax.cli", *role, "--wait", "5"],
      cwd=repo_root,
      env=subprocess_env(),
      capture_output=True,
      text=True,
      timeout=120,
    )
    out_l, _ = learner.communicate(timeout=300)
    assert learner.returncode == 0, out_l[-3000:]
    out_s, _ = sampler.communicate(timeout=60)  # stops when the learner announces the end
    assert sampler.returncode == 0, out_s[-3000:]
  finally:
    _stop(learner, sampler)
  assert "2 process(es) joined" in out_s and f"run {run_id} finished" in out_s
  assert keyless.returncode == 2 and "--key-file" in keyless.stderr, keyless.stderr
  rl = json.loads((tmp_path / "w" / "summary.json").read_text())["rl"]
  assert rl["steps"] == 8 and rl["trajectories"] >= 8 * 16 and rl["bad_records"] == 0
  assert rl["rejected"]["unauthenticated"] == 0


def test_sampler_role_names_a_missing_run(kafka_broker, repo_root):
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "sao_jax.cli",
      "sampler",
      "--bootstrap",
      kafka_broker.bootstrap,
      "--run-id",
      "nope",
      "--wait",
      "2",
    ],
    cwd=repo_root,
    env=subprocess_env(),
    capture_output=True,
    text=True,
    timeout=60,
  )
  assert proc.returncode == 2 and "no SAO run 'nope'" in proc.stderr


@pytest.mark.parametrize("samplers", ["local", "remote"])
def test_learner_kill_9_replays_from_committed_offsets(kafka_broker, repo_root, tmp_path, samplers):
  """The journal is deleted after the crash (a learner restarted on another machine), so
  only the broker can replay: records after the committed offsets are read again, none is
  lost and none applied twice. `remote`: the samplers are a separate `sao-jax sampler` role
  that outlives the learner and follows the restarted one to its new incarnation."""
  run_id = f"replay-{samplers}-{uuid.uuid4().hex[:8]}"
  workdir = tmp_path / "w"
  args = [
    "train" if samplers == "local" else "learner",
    "--config",
    CFG,
    "--workdir",
    str(workdir),
    "--no-progress",
    "--set",
    "transport.kind=kafka",
    "--set",
    f"transport.bootstrap_servers={kafka_broker.bootstrap}",
    "--set",
    f"transport.run_id={run_id}",
    "--set",
    "rl.steps=30",
    "--set",
    "checkpoint_every=8",
    "--set",
    "recovery.shadow_every=10",
    "--set",
    "recovery.val_problems=32",
  ]
  role = None
  if samplers == "remote":
    from sao_jax.transport import auth

    auth.load_or_create(workdir)  # the run's key, before either role starts
    role = _popen(
      [
        "sampler",
        "--bootstrap",
        kafka_broker.bootstrap,
        "--run-id",
        run_id,
        "--num",
        "2",
        "--wait",
        "240",
        "--key-file",
        str(workdir / auth.KEY_FILE),
      ],
      repo_root,
    )
  proc = _popen(args, repo_root)
  try:
    deadline = time.time() + 300
    ledger = workdir / "ledger.jsonl"
    while not ledger.exists() or ledger.read_text().count("\n") < 20:
      assert proc.poll() is None, proc.communicate()[0][-3000:]
      assert time.time() < deadline
      time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    shutil.rmtree(workdir / "journal")
    proc = _popen(args, repo_root)
    out, _ = proc.communicate(timeout=600)
    if role is not None:
      out_s, _ = role.communicate(timeout=60)  # stops when the learner announces the end
      assert role.returncode == 0, out_s[-3000:]
      assert "restarted (incarnation" in out_s and f"run {run_id} finished" in out_s
  finally:
    _stop(proc, *([role] if role else []))
  assert proc.returncode == 0, out[-3000:]
  rl = json.loads((workdir / "summary.json").read_text())["rl"]
  assert rl["steps"] == 30 and rl["resumes"] == 1
  rows = Ledger(workdir / "ledger.jsonl").rows()
  used = [i for r in rows for i in r["applied"] + r["stale"]]
  assert [r["step"] for r in rows] == list(range(1, 31))
  assert len(used) == len(set(used)), "a trajectory was applied twice"
  topic = f"sao.{run_id}.trajectories"
  on_topic = topic_record_ids(kafka_broker.bootstrap, topic, 4)
  committed = committed_offsets(kafka_broker.bootstrap, f"sao.{run_id}.learner", topic, 4)
  before_commit = {rid for part, off, rid in on_topic if off < committed[part]}
  # (a second answer to one hand-out is dead-lettered, not used: accounted for)
  dead = {
    rid for _, _, rid in topic_record_ids(kafka_broker.bootstrap, f"sao.{run_id}.dead-letter", 1)
  }
  assert before_commit and before_commit <= set(used) | dead, (
    "a committed trajectory was never used"
  )
  assert set(used) <= {rid for _, _, rid in on_topic}
  # The finished run deleted both incarnations' task topics, and kept the record of the rest.
  from kafka import KafkaAdminClient

  # Topic deletion completes asynchronously on the broker: a deleted topic may still be
  # listed for a moment, so wait up to 15 s for the listing to settle. (A sampler fetching at
  # the deletion brought a topic back for good: KafkaSpec.delete_task_topics now deletes
  # again until the listing stays empty; tests/test_kafka.py shows it.)
  kept = {f"sao.{run_id}.{n}" for n in ("trajectories", "dead-letter", "control")}
  admin = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap)
  try:
    deadline = time.time() + 15
    while True:
      left = {t for t in admin.list_topics() if t.startswith(f"sao.{run_id}.")}
      if left == kept or time.time() > deadline:
        break
      time.sleep(0.5)
  finally:
    admin.close()
  assert left == {f"sao.{run_id}.{n}" for n in ("trajectories", "dead-letter", "control")}, left
