"""The package's layering: no import cycle, no import from a higher layer, and every module
imports on its own in dependency order."""

import subprocess
import sys

from conftest import REPO_ROOT, load_script, subprocess_env


def _graph_module():
  return load_script("scripts/import_graph.py")


def test_no_cycles_and_no_upward_imports():
  ig = _graph_module()
  g = ig.graph()
  assert len(g) > 40 and "sao_jax.runners.sao" in g
  assert ig.cycles(g) == []
  assert ig.upward(g) == []
  # The checker sees a cycle when there is one.
  assert ig.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_module_imports_in_dependency_order():
  ig = _graph_module()
  g = ig.graph()
  order, seen = [], set()

  def visit(m):
    if m not in seen:
      seen.add(m)
      for d in sorted(g[m]):
        visit(d)
      order.append(m)

  for m in sorted(g):
    visit(m)
  code = "import importlib, sys\nfor m in sys.argv[1:]:\n  importlib.import_module(m)\n"
  proc = subprocess.run(
    [sys.executable, "-c", code, *order],
    cwd=REPO_ROOT,
    env=subprocess_env(),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]


def test_experiment_scripts_keep_to_themselves(tmp_path):
  """experiments/: no sys.path changes, no other script's private names, no cycles (the
  repository's scripts pass); the checker sees each on a planted set."""
  ig = _graph_module()
  assert ig.experiment_problems()[0] == []
  (tmp_path / "a.py").write_text(
    "import sys\nimport b as B\nfrom b import _x, y\nsys.path.insert(0, '.')\nB._z()\n"
  )
  (tmp_path / "b.py").write_text("import a\n_x = y = 1\n" + "z = 1\n" * 400)
  bad, long = ig.experiment_problems(tmp_path)
  assert bad == [
    "a.py imports b's private _x",
    "a.py:4 changes sys.path",
    "a.py:5 uses b's private _z",
    "cycle among experiments: a <-> b",
  ]
  assert long == ["b.py: 402 lines"]
