"""Writes RESULTS.md from the result files under results/ and the analyses declared under
experiments/claims/ (sao_jax.analysis; nothing in it is typed in by hand).

  python scripts/results_md.py                 # -> RESULTS.md
  python scripts/results_md.py --check         # exit 1 if RESULTS.md is not what this makes
  python scripts/results_md.py --results DIR --claims DIR --out /tmp/RESULTS.md
"""

from __future__ import annotations

import argparse
import difflib
import pathlib
import sys

from sao_jax.analysis import data, render

COMMAND = "python scripts/results_md.py"


def main(argv=None) -> int:
  p = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  p.add_argument("--results", default=str(render.RESULTS), help="result files (default results/)")
  p.add_argument("--claims", default=str(render.CLAIMS), help="claim declarations directory")
  p.add_argument("--out", default=str(render.REPO / "RESULTS.md"))
  p.add_argument(
    "--check", action="store_true", help="compare with --out instead of writing; exit 1 if differ"
  )
  args = p.parse_args(argv)
  results = pathlib.Path(args.results)
  evs = render.evaluate_all(results, args.claims)
  text = render.results_markdown(results, args.claims, COMMAND, evs=evs)
  tracked = data.committed(results)
  if tracked is not None:
    loose = sorted(render.read_files(results, evs) - tracked)
    if loose:
      print(
        f"warning: {len(loose)} result file(s) that analyses read are not committed, so a "
        "clean clone makes another RESULTS.md (git add -f them, or move them out of "
        f"{results}): " + ", ".join(loose[:10]) + (" ..." if len(loose) > 10 else ""),
        file=sys.stderr,
      )
  out = pathlib.Path(args.out)
  if args.check:
    old = out.read_text() if out.exists() else ""
    if old == text:
      print(f"{out}: up to date")
      return 0
    diff = difflib.unified_diff(
      old.splitlines(), text.splitlines(), str(out), "generated", lineterm="", n=1
    )
    print("\n".join(list(diff)[:60]))
    print(f"{out} differs from what {COMMAND} makes from the committed results: regenerate it")
    return 1
  out.write_text(text)
  n = sum(len(ev.rows) for ev in evs)
  print(f"{out}: {len(evs)} claims, {n} rows")
  return 0


if __name__ == "__main__":
  sys.exit(main())
