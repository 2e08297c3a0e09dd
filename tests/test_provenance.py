"""sao_jax.provenance.write_result: the one writer of result JSONs with their provenance."""

from __future__ import annotations

import json

import numpy as np

from sao_jax.provenance import write_result


def test_write_result_puts_provenance_first_and_creates_the_directory(tmp_path):
  doc = {"b": 1, "a": [1.5, None]}
  path = write_result(
    tmp_path / "x" / "y" / "r.json", doc, argv=["bench.py", "--quick"], devices=False
  )
  assert path == tmp_path / "x" / "y" / "r.json"
  text = path.read_text()
  assert json.loads(text) == doc and text == json.dumps(doc, indent=2)
  assert list(doc) == ["provenance", "b", "a"]  # the caller's dict is what was written
  assert doc["provenance"]["command"] == "python bench.py --quick"
  assert "commit" in doc["provenance"] and "machine" in doc["provenance"]


def test_write_result_keeps_a_provenance_block_where_the_caller_put_it(tmp_path):
  block = {"command": "python x.py", "commit": "abc"}
  doc = {"arms": {}, "provenance": block, "value": np.float32(0.5)}
  write_result(tmp_path / "r.json", doc, default=float)
  written = json.loads((tmp_path / "r.json").read_text())
  assert list(written) == ["arms", "provenance", "value"] and written["provenance"] == block
  assert written["value"] == 0.5
