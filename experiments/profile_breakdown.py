"""Where a learner or sampler process spends its wall-clock, from a py-spy profile: the main
thread's samples (idle included) grouped into the loop's stages.

Profile a running benchmark arm (py-spy is a separate tool, not a dependency: `pip install
py-spy` in any environment; --nonblocking leaves the process running undisturbed):
  py-spy record -p LEARNER_PID --nonblocking --idle -r 50 -d 60 -f raw -o learner.txt
  py-spy record -p SAMPLER_PID --nonblocking --idle -r 50 -d 60 -f raw -o sampler.txt
then
  python experiments/profile_breakdown.py learner.txt:learner sampler.txt:sampler \\
      --out results/bench_longtail_pinned/profile.json

Each sample of the main thread (its stack starts at `<module>`, or at the multiprocessing
entry point in a spawned sampler) is put in the first stage whose frame it contains, in the
order listed below; the rest is `other`. Fractions are of the main thread's samples, so they
add up to 1 and idle waiting shows as its own stage.
"""

from __future__ import annotations

import argparse
import collections
import pathlib

from sao_jax.results_file import ResultFile

# (stage, frames that put a sample in it), first match wins.
STAGES = {
  "learner": [
    ("held-out eval (outside the training clock)", ("maybe_eval (", "evaluate (")),
    ("publish parameters", ("publish (sao_jax/runners/sao.py",)),
    ("snapshot", ("snapshot (sao_jax/runners/sao.py",)),
    ("validate (shadows)", ("validate (sao_jax/runners/sao.py",)),
    ("form the batch", ("batch_from (", "take_batch (", "batch_rows (")),
    ("update (jitted step)", ("update (sao_jax/runners/sao.py",)),
    ("wait for trajectories", ("get_records (",)),
    ("ingest (decode, check, journal)", ("ingest (",)),
    ("hand out tasks", ("hand_out (",)),
    ("metrics and logging", ("log_step (", "_row (", "write (sao_jax/metrics.py")),
  ],
  "sampler": [
    ("load new parameters", ("poll (sao_jax/transport/params.py", "_maybe_swap (")),
    ("wait for tasks", ("get_tasks (",)),
    ("fill slots (prompts, prefill)", ("_refill (",)),
    ("rewards (environment steps)", ("step_many (",)),
    ("send trajectories", ("send (sao_jax/runners/sampler_proc.py", "put_trajectory (")),
    ("trajectory assembly", ("_trajectory (",)),
    # the rest of a continuous-batching step: the jitted decode call and waiting for its
    # result (dispatch is asynchronous, so the wait shows in device_get)
    ("decode (jitted)", ("step (sao_jax/rollout.py", "sample_batch (")),
  ],
}
MAIN_THREAD = ("<module> (", "spawn_main (")


def breakdown(path: str | pathlib.Path, role: str) -> dict:
  counts: collections.Counter = collections.Counter()
  for line in pathlib.Path(path).read_text().splitlines():
    stack, _, n = line.rpartition(" ")
    if not stack or not n.isdigit() or not stack.startswith(MAIN_THREAD):
      continue
    stage = next(
      (name for name, frames in STAGES[role] if any(f in stack for f in frames)), "other"
    )
    counts[stage] += int(n)
  total = sum(counts.values())
  return {
    "samples": total,
    "fractions": {k: v / total for k, v in counts.most_common()} if total else {},
  }


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  ap.add_argument("profiles", nargs="+", help="RAW_FILE:ROLE (role: learner or sampler)")
  ap.add_argument("--out", default="")
  args = ap.parse_args(argv)
  rf = ResultFile(args.out, series="profile_breakdown")
  out = rf.update(profiles={}).doc
  for spec in args.profiles:
    path, _, role = spec.rpartition(":")
    if role not in STAGES:
      ap.error(f"{spec}: role must be one of {', '.join(STAGES)}")
    b = breakdown(path, role)
    out["profiles"][pathlib.Path(path).stem] = {"role": role, **b}
    print(f"{path} ({role}, {b['samples']} main-thread samples)")
    for k, v in b["fractions"].items():
      print(f"  {100 * v:5.1f} %  {k}")
  if rf.finish():
    print(f"results: {args.out}")
  return out


if __name__ == "__main__":
  main()
