"""sao_jax.provenance: the command, commit and machine (CPU model, SIMD flags) of a result."""

from __future__ import annotations

from sao_jax.provenance import cpu, machine


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
