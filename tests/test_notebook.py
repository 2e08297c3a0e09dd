"""notebooks/curves.ipynb executes headless on a real (tiny) run and saves its figure.

The notebook is what users reproduce results with, so it is tested the way they run it: a
fresh kernel, the workdir given by SAO_JAX_WORKDIR, no outputs committed.
"""

from __future__ import annotations

import json
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")


def _kernel_python() -> str:
  """The interpreter the `python3` kernel would start, or skip if there is no such kernel."""
  from jupyter_client.kernelspec import KernelSpecManager
  from jupyter_client.manager import KernelManager

  if "python3" not in KernelSpecManager().get_all_specs():
    pytest.skip("no python3 Jupyter kernel spec (install ipykernel)")
  return KernelManager(kernel_name="python3").format_kernel_cmd()[0]


@pytest.mark.slow
def test_curves_notebook(tiny_run_dir, repo_root, monkeypatch):
  # The native python3 spec says `python`, which jupyter_client maps to sys.executable: the
  # kernel then imports this environment's sao_jax, not whatever `python` is on PATH.
  assert _kernel_python() == sys.executable
  path = repo_root / "notebooks" / "curves.ipynb"
  nb = nbformat.read(path, as_version=4)
  assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), (
    "commit curves.ipynb with its outputs cleared"
  )

  monkeypatch.setenv("SAO_JAX_WORKDIR", str(tiny_run_dir))  # inherited by the kernel
  client = nbclient.NotebookClient(
    nb, kernel_name="python3", timeout=120, resources={"metadata": {"path": str(repo_root)}}
  )
  client.execute()  # raises CellExecutionError on the first failing cell

  outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
  assert not [o for o in outputs if o.output_type == "error"]
  assert any("image/png" in o.get("data", {}) for o in outputs), "figure not shown"
  png = tiny_run_dir / "curves.png"
  assert png.exists()
  data = png.read_bytes()
  assert data[:8] == b"\x89PNG\r\n\x1a\n"
  assert len(data) > 10_000, f"curves.png is only {len(data)} bytes"

  # The summary table prints one row per phase; its accuracy column is summary.json's.
  summary = json.loads((tiny_run_dir / "summary.json").read_text())
  text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
  rows = {line.split()[0]: line.split() for line in text.splitlines() if line.strip()}
  for phase in ("sft", "rl"):
    assert phase in rows, text
    assert rows[phase][1] == f"{summary[phase]['accuracy']:.4f}", text
