"""The HumanEval harness checked end to end: every problem's canonical solution must pass its
own tests in our sandbox, and a wrong body must fail every one. This measures the harness
(the problems file, the job builder, the sandbox), not a model: no policy of ours is scored
on HumanEval.

  python experiments/humaneval_harness.py              # -> results/humaneval_harness.json
"""

from __future__ import annotations

import argparse
import time

from sao_jax.envs.humaneval import evaluate, load_problems
from sao_jax.results_file import ResultFile
from sao_jax.sandbox import SandboxPool

WRONG = "    return None\n"


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--out", default="results/humaneval_harness.json")
  args = p.parse_args(argv)
  rf = ResultFile(args.out, series="humaneval_harness", devices=False)
  problems = load_problems()
  t0 = time.perf_counter()
  with SandboxPool() as pool:

    def fixed(body):
      return lambda prompts, n: [[body(q)] * n for q in problems]

    right = evaluate(fixed(lambda q: q.canonical_solution), problems, n=1, ks=(1,), pool=pool)
    wrong = evaluate(fixed(lambda q: WRONG), problems, n=1, ks=(1,), pool=pool)
  out = {
    "problems": len(problems),
    "canonical": right,
    "canonical_passed": sum(r["correct"] for r in right["per_problem"]),
    "wrong_body": wrong,
    "wrong_body_passed": sum(r["correct"] for r in wrong["per_problem"]),
    "seconds": time.perf_counter() - t0,
  }
  rf.finish(out)
  print(
    f"{args.out}: canonical {out['canonical_passed']}/{out['problems']} pass, "
    f"wrong body {out['wrong_body_passed']}/{out['problems']} pass"
  )
  return out


if __name__ == "__main__":
  main()
