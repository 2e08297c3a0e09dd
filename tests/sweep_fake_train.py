"""Stand-in for `sao-jax train` in the sweep's fast tests (the slow test runs the real one).

Takes the same arguments (--config, --set KEY=VALUE..., --workdir, --no-progress), imports no
JAX, and behaves by `rl.optim.lr`:
  0.5: exits with code 3 (a failing trial);  0.6: rl.accuracy is NaN (a diverging one);
  0.7: summary.json lacks rl.accuracy;       otherwise: rl.accuracy = lr + seed / 100.
With rl.steps=0 and rl.max_seconds=0 it is an SFT-only run (`Sweep.shared_sft`): a
checkpoints/sft folder and summary {"sft": {"accuracy": seed / 1000}}.
It writes an `rl` eval row (eval_accuracy = lr, train_seconds = k * eval.every_seconds)
every 0.05 s for rl.max_seconds seconds, starts a child process in its process group (to
check that the sweep stops whole groups), appends its pid to starts.txt and, like the real
trainer, returns at once when its workdir already holds a summary.
"""

import ast
import json
import math
import pathlib
import subprocess
import sys
import time


def main(argv):
  sets, workdir = {}, None
  it = iter(argv)
  for a in it:
    if a == "--set":
      k, _, v = next(it).partition("=")
      sets[k] = ast.literal_eval(v)
    elif a == "--workdir":
      workdir = pathlib.Path(next(it))
    elif a == "--config":
      next(it)
  workdir.mkdir(parents=True, exist_ok=True)
  with open(workdir / "starts.txt", "a") as f:
    f.write(f"{__import__('os').getpid()}\n")
  if (workdir / "summary.json").exists():
    return 0
  if sets.get("rl.steps") == 0 and sets.get("rl.max_seconds") == 0.0:  # SFT only
    (workdir / "checkpoints" / "sft").mkdir(parents=True)
    sft = {"accuracy": int(sets["seed"]) / 1000, "steps": 7}
    (workdir / "summary.json").write_text(json.dumps({"sft": sft}))
    return 0
  lr, seed = float(sets["rl.optim.lr"]), int(sets["seed"])
  child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  (workdir / "child.pid").write_text(str(child.pid))
  every = float(sets.get("eval.every_seconds", 1.0))
  with open(workdir / "metrics.jsonl", "a") as f:
    t0, k = time.time(), 0
    while time.time() - t0 < float(sets.get("rl.max_seconds", 0.2)):
      k += 1
      f.write(
        json.dumps({"phase": "rl", "step": k, "train_seconds": k * every, "eval_accuracy": lr})
        + "\n"
      )
      f.flush()
      time.sleep(0.05)
  child.kill()
  child.wait()
  if lr == 0.5:
    return 3
  rl = {"steps": k}
  if lr == 0.6:
    rl["accuracy"] = math.nan
  elif lr != 0.7:
    rl["accuracy"] = lr + seed / 100
  (workdir / "summary.json").write_text(json.dumps({"rl": rl, "wall_s": 0.1}))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
