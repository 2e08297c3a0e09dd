"""sao_jax.provenance.write_result: the one writer of result JSONs with their provenance."""

from __future__ import annotations

import json

import numpy as np

from sao_jax.provenance import cpu, machine, write_result


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


def test_cpu_reads_model_and_simd_flags_of_the_first_processor():
  info = (
    "processor\t: 0\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\nstepping\t: 1\n"
    "flags\t\t: fpu sse4_2 avx avx2 fma\n\n"
    "processor\t: 1\nmodel name\t: Other\nflags\t\t: avx512f\n"
  )
  assert cpu(info) == {
    "model": "AMD EPYC",
    "simd": ["sse4_2", "avx", "avx2", "fma"],
    "family_model_stepping": "25/1/1",
  }
  arm = "processor\t: 0\nFeatures\t: fp asimd evtstrm\nModel\t: Raspberry Pi 4\n"
  assert cpu(arm) == {"model": "Raspberry Pi 4", "simd": ["asimd"]}
  here = machine(devices=False)["cpu"]
  assert here["model"] and isinstance(here.get("simd", []), list)


def test_provenance_names_the_tracked_files_that_differ_from_the_commit(monkeypatch):
  from sao_jax import provenance as P

  answers = {"status": " M results/x.json\nM  sao_jax/a.py", "rev-parse": "abc"}
  monkeypatch.setattr(P, "_git", lambda *args: answers[args[0]])
  p = P.provenance(["x.py"], devices=False)
  assert p["dirty"] and p["dirty_files"] == ["results/x.json", "sao_jax/a.py"]
  answers["status"] = ""
  p = P.provenance(["x.py"], devices=False)
  assert not p["dirty"] and p["dirty_files"] == []
