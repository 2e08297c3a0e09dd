"""The package's module import graph, checked against its layers.

  python scripts/import_graph.py            # listing: each module, its layer, what it imports
  python scripts/import_graph.py --check    # exit 1 on a cycle or an import from a higher layer
  python scripts/import_graph.py --longest 5  # the longest functions (lines), for reviews

The experiment scripts are checked too (`experiment_problems`): no sys.path changes, no
private names of another script, no import cycles among them; scripts over 400 lines are
listed.

Imports are read from the source (module level and inside functions alike, since a function-
level import is still a dependency), so nothing is executed. Layers, top to bottom: a module
may import modules of its own layer (as long as there is no cycle) and of layers below it,
never above.
"""

from __future__ import annotations

import argparse
import ast
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "sao_jax"

# Most specific prefix wins. Layer 4 is the command line, 0 what everything may use.
LAYERS: dict[str, int] = {
  "sao_jax.cli": 4,
  "sao_jax.analysis": 4,  # results as data: reads result files, nothing imports it
  "sao_jax.runners": 3,
  "sao_jax.bench": 3,  # what the experiment scripts measure (their library side)
  "sao_jax.sweep": 3,
  "sao_jax.sweep_report": 3,
  "sao_jax.replay": 3,
  "sao_jax.sim": 2,
  "sao_jax.learner": 2,
  "sao_jax.rollout": 2,
  "sao_jax.evaluation": 2,
  "sao_jax.setup": 2,
  "sao_jax.policy": 2,
  "sao_jax.tasks": 2,
  "sao_jax.families": 2,
  "sao_jax.checkpoint": 2,
  "sao_jax.recovery": 2,
  "sao_jax.buffer": 2,
  "sao_jax.admission": 2,
  "sao_jax.compression.policy": 2,
  "sao_jax.compression.rollout": 2,
  "sao_jax.compression.sao_update": 2,
  "sao_jax.models": 1,
  "sao_jax.rl": 1,
  "sao_jax.envs": 1,
  "sao_jax.data": 1,
  "sao_jax.transport": 1,
  "sao_jax.compression": 1,
  "sao_jax.sampling": 1,
  "sao_jax.sandbox": 1,
  "sao_jax.packing": 1,
  "sao_jax.seqpack": 1,
  "sao_jax.state": 1,
  "sao_jax.batches": 1,
  "sao_jax.slots": 1,
  "sao_jax": 0,
}
LAYER_NAMES = {
  4: "cli",
  3: "runners",
  2: "learner/rollout/evaluation/setup",
  1: "models/rl/envs/data/transport/compression",
  0: "config/tokenizer/procs",
}


def layer(module: str) -> int:
  best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
  return LAYERS[best]


def modules() -> dict[str, pathlib.Path]:
  out = {}
  for path in sorted((ROOT / PACKAGE).rglob("*.py")):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
      parts = parts[:-1]
    out[".".join(parts)] = path
  return out


def imports_of(module: str, path: pathlib.Path, known: set[str]) -> set[str]:
  """Package modules that `module` imports (`from a import b` counts `a.b` if it is a module)."""
  tree = ast.parse(path.read_text(), filename=str(path))
  is_pkg = path.name == "__init__.py"
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parent = module.split(".")[: len(module.split(".")) - node.level + (1 if is_pkg else 0)]
        base = ".".join(parent + ([base] if base else []))
      names = [base] + [f"{base}.{a.name}" for a in node.names]
    else:
      continue
    for name in names:
      while name and name not in known:
        name = name.rpartition(".")[0]
      if name and name != module:
        found.add(name)
  return found


def graph() -> dict[str, set[str]]:
  mods = modules()
  known = set(mods)
  return {m: imports_of(m, p, known) - {PACKAGE} for m, p in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
  """Strongly connected components with more than one module (Tarjan)."""
  index, low, stack, on, out = {}, {}, [], set(), []
  counter = [0]

  def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in g[v]:
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        out.append(sorted(comp))

  sys.setrecursionlimit(10000)
  for v in g:
    if v not in index:
      visit(v)
  return out


def upward(g: dict[str, set[str]]) -> list[tuple[str, str]]:
  return sorted((m, d) for m, deps in g.items() for d in deps if layer(d) > layer(m))


EXPERIMENTS = "experiments"
MAX_SCRIPT_LINES = 400


def experiment_problems(directory: pathlib.Path | None = None) -> tuple[list[str], list[str]]:
  """What the experiment scripts (experiments/*.py) may not do: change sys.path, import
  another script's private names (`from other import _x`, `other._x`), or import each other
  in a cycle; and what they should not: exceed MAX_SCRIPT_LINES (reported, not failed on).
  Returns (violations, long scripts)."""
  scripts = {p.stem: p for p in sorted((directory or ROOT / EXPERIMENTS).glob("*.py"))}
  bad, deps = [], {name: set() for name in scripts}
  for name, path in scripts.items():
    tree = ast.parse(path.read_text(), filename=str(path))
    aliases = {}
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        for a in node.names:
          if a.name in scripts:
            deps[name].add(a.name)
            aliases[a.asname or a.name] = a.name
      elif isinstance(node, ast.ImportFrom) and node.module in scripts and not node.level:
        deps[name].add(node.module)
        bad += [
          f"{path.name} imports {node.module}'s private {a.name}"
          for a in node.names
          if a.name.startswith("_")
        ]
      elif isinstance(node, ast.Call):
        f = node.func
        if (
          isinstance(f, ast.Attribute)
          and f.attr in ("insert", "append")
          and isinstance(f.value, ast.Attribute)
          and f.value.attr == "path"
          and isinstance(f.value.value, ast.Name)
          and f.value.value.id == "sys"
        ):
          bad.append(f"{path.name}:{node.lineno} changes sys.path")
    for node in ast.walk(tree):
      if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in aliases
        and node.attr.startswith("_")
      ):
        bad.append(f"{path.name}:{node.lineno} uses {aliases[node.value.id]}'s private {node.attr}")
  bad += [f"cycle among experiments: {' <-> '.join(c)}" for c in cycles(deps)]
  long = [
    f"{p.name}: {n} lines"
    for p in scripts.values()
    if (n := len(p.read_text().splitlines())) > MAX_SCRIPT_LINES
  ]
  return sorted(set(bad)), long


def longest_functions(n: int) -> list[tuple[int, str]]:
  rows = []
  for path in sorted((ROOT / PACKAGE).rglob("*.py")):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        rows.append(
          (node.end_lineno - node.lineno + 1, f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
        )
  return sorted(rows, reverse=True)[:n]


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--check", action="store_true", help="only report violations; exit 1 if any")
  p.add_argument("--longest", type=int, default=0, help="list the N longest functions")
  args = p.parse_args(argv)
  g = graph()
  cyc, up = cycles(g), upward(g)
  if not args.check:
    for lay in sorted(LAYER_NAMES, reverse=True):
      print(f"layer {lay} ({LAYER_NAMES[lay]})")
      for m in sorted(x for x in g if layer(x) == lay):
        deps = ", ".join(sorted(d.removeprefix(PACKAGE + ".") for d in g[m])) or "-"
        print(f"  {m.removeprefix(PACKAGE + '.') or PACKAGE:32s} <- {deps}")
  if args.longest:
    print("longest functions (lines):")
    for lines, name in longest_functions(args.longest):
      print(f"  {lines:5d}  {name}")
  for c in cyc:
    print(f"cycle: {' <-> '.join(c)}")
  for m, d in up:
    print(f"upward import: {m} (layer {layer(m)}) imports {d} (layer {layer(d)})")
  # The package never imports a script (`modules()` holds only sao_jax's own).
  exp_bad, exp_long = experiment_problems()
  for line in exp_bad:
    print(f"experiments: {line}")
  if not args.check and exp_long:
    print(f"experiment scripts over {MAX_SCRIPT_LINES} lines: {'; '.join(exp_long)}")
  print(
    f"{len(g)} modules, {sum(map(len, g.values()))} imports, {len(cyc)} cycles, "
    f"{len(up)} upward imports; experiments: {len(exp_bad)} violations, "
    f"{len(exp_long)} scripts over {MAX_SCRIPT_LINES} lines"
  )
  return 1 if (cyc or up or exp_bad) else 0


if __name__ == "__main__":
  sys.exit(main())
