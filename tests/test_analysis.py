"""Results as data (sao_jax.analysis): claim declarations, their evaluation against result
files, RESULTS.md, and the claim notebooks. Synthetic results check the statistics and the
labelling rules; the committed results check that RESULTS.md is what they make."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys

import pytest
from conftest import REPO_ROOT
from scipy import stats as sp_stats

from sao_jax.analysis import declare, estimate, render

AMD = {"model": "AMD EPYC", "family_model_stepping": "25/17/1"}
INTEL = {"model": "Intel(R) Xeon(R) Processor", "family_model_stepping": "6/207/2"}


def _result(path, seed, cpu, control, treatment, time="2026-12-01T00:00:00+0000"):
  doc = {
    "provenance": {
      "command": f"python experiments/bench.py --seed {seed}",
      "commit": "0123456789abcdef",
      "time": time,
      "machine": {"cpu": cpu},
    },
    "series": "bench/toy",
    "seed": seed,
    "arms": {
      "control": {"correct": control, "accuracy": sum(control) / len(control)},
      "treatment": {"correct": treatment, "accuracy": sum(treatment) / len(treatment)},
    },
  }
  path.write_text(json.dumps(doc))


CLAIM = """
key = "t"
title = "A toy claim"
seed = "the source says < 10 % lost"

[[analysis]]
id = "lost"
label = "items lost"
declared = "2026-12-02"
primary = true
files = ["toy_seed*.json"]
seeds = [0, 1]
statistic = "pooled_loss"
control = "arms/control/correct"
treatment = "arms/treatment/correct"
goal = { op = "<=", value = 0.10, on = "bound" }
format = { spec = "{:.1f}", scale = 100, suffix = " %" }
command = "python experiments/bench.py --seed S"

[[analysis]]
id = "acc"
label = "treatment accuracy"
declared = "2026-12-02"
files = ["toy_seed*.json"]
seeds = [0, 1]
where = [{ path = "arms/control/accuracy", op = ">=", value = 0.5 }]
statistic = "mean"
metric = "arms/treatment/accuracy"
goal = { op = ">=", value = 0.5 }
command = "python experiments/bench.py --seed S"

[[analysis]]
id = "absent"
label = "a series never run"
declared = "2026-12-02"
exploratory = true
why = "chosen after the others were seen"
files = ["nothing*.json"]
statistic = "mean"
metric = "x"
command = "python experiments/other.py"
"""


@pytest.fixture
def toy(tmp_path):
  results, claims = tmp_path / "results", tmp_path / "claims"
  results.mkdir()
  claims.mkdir()
  _result(results / "toy_seed0.json", 0, AMD, [1] * 40, [1] * 39 + [0])
  _result(results / "toy_seed1.json", 1, AMD, [1] * 30 + [0] * 10, [1] * 30 + [1] * 10)
  _result(results / "toy_seed2.json", 2, AMD, [0] * 40, [1] * 40, time="2026-12-03T00:00:00+0000")
  _result(results / "toy_seed3.json", 3, INTEL, [1] * 40, [0] * 40)
  (results / "unread.json").write_text(json.dumps({"provenance": {"command": "python x.py"}}))
  (claims / "t.toml").write_text(CLAIM)
  return results, claims


def test_pooled_loss_counts_control_answered_items_and_bounds_them(toy):
  results, claims = toy
  ev = render.evaluate_claim("t", results, claims)
  rows = [r for r in ev.rows if r.analysis.id == "lost"]
  declared = [r for r in rows if not r.exploratory]
  assert len(declared) == 1
  e = declared[0].estimate
  # seed 0: 1 of 40 control-right lost; seed 1: 0 of 30 -> 1 of 70
  assert (e.estimate, e.n) == (pytest.approx(1 / 70), 2)
  assert e.bound == pytest.approx(sp_stats.beta.ppf(0.95, 2, 69))
  assert declared[0].status == ("met" if e.bound <= 0.10 else "not met")
  assert declared[0].retrospective == 2  # both runs before the declaration
  assert declared[0].host == "AMD EPYC (25/17/1)"


def test_undeclared_seeds_are_exploratory_and_hosts_never_pooled(toy):
  results, claims = toy
  ev = render.evaluate_claim("t", results, claims)
  rows = [r for r in ev.rows if r.analysis.id == "lost"]
  extra = [r for r in rows if r.exploratory]
  # AMD: seeds 0-2 (seed 2's control got nothing right: it adds no items); Intel: seed 3 alone
  assert {r.host for r in extra} == {"AMD EPYC (25/17/1)", "Intel(R) Xeon(R) Processor (6/207/2)"}
  assert all("adds seeds" in r.exploratory for r in extra)
  intel = next(r for r in extra if r.host.startswith("Intel"))
  assert (intel.estimate.estimate, intel.status) == (1.0, "not met")
  amd = next(r for r in extra if r.host.startswith("AMD"))
  assert amd.estimate.seeds == (0, 1)  # seed 2 has no control-answered items


def test_where_filters_are_named_and_goal_is_computed(toy):
  results, claims = toy
  ev = render.evaluate_claim("t", results, claims)
  acc = next(r for r in ev.rows if r.analysis.id == "acc" and not r.exploratory)
  assert acc.estimate.values == (pytest.approx(39 / 40), 1.0)
  assert acc.status == "met"
  assert acc.excluded == ()
  extra = next(r for r in ev.rows if r.analysis.id == "acc" and r.exploratory)
  assert any("seed 2" in x and "fails" in x for x in extra.excluded)


def test_absent_series_names_its_command_and_unread_files_are_listed(toy):
  results, claims = toy
  text = render.results_markdown(results, claims, "cmd")
  assert "no data: run `python experiments/other.py`" in text
  assert "exploratory: chosen after the others were seen" in text
  glance = text.split("## At a glance")[1].split("## (t)")[0]
  assert "items lost" in glance and "a series never run" not in glance
  assert "`unread.json`" in text.split("no declaration reads")[1]
  assert "toy_seed0.json" not in text.split("no declaration reads")[1]


def test_in_a_git_tree_only_committed_files_are_listed(toy):
  # A run's workdir left under results/ must not make RESULTS.md differ from a clean clone's.
  results, claims = toy
  root = results.parent
  env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "HOME": str(root)}
  env |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"}
  subprocess.run(["git", "init", "-q"], cwd=root, check=True, env=env)
  subprocess.run(["git", "add", "results"], cwd=root, check=True, env=env)
  (results / "seed0" / "run").mkdir(parents=True)
  (results / "seed0" / "run" / "metrics.jsonl").write_text('{"step": 1}\n')
  text = render.results_markdown(results, claims, "cmd")
  assert "`unread.json`" in text.split("no declaration reads")[1]
  assert "metrics.jsonl" not in text


@pytest.mark.parametrize(
  "old, new, message",
  [
    ('label = "items lost"', 'label = "items lost"\ncolour = "red"', "unknown key"),
    ('statistic = "pooled_loss"', 'statistic = "magic"', "unknown statistic"),
    ('control = "arms/control/correct"', "", "needs"),
    ('declared = "2026-12-02"', 'declared = "last week"', "ISO date"),
  ],
)
def test_declarations_are_validated(tmp_path, old, new, message):
  (tmp_path / "t.toml").write_text(CLAIM.replace(old, new, 1))
  with pytest.raises(declare.DeclarationError, match=message):
    estimate.load_claims(tmp_path)


def test_exploratory_needs_a_reason_and_cannot_be_primary(tmp_path):
  (tmp_path / "t.toml").write_text(CLAIM.replace('why = "chosen after the others were seen"', ""))
  with pytest.raises(declare.DeclarationError, match="must say why"):
    estimate.load_claims(tmp_path)
  (tmp_path / "t.toml").write_text(
    CLAIM.replace('why = "chosen after the others were seen"', 'why = "x"\nprimary = true')
  )
  with pytest.raises(declare.DeclarationError, match="cannot be primary"):
    estimate.load_claims(tmp_path)


def test_statistics_registry_documents_every_statistic():
  doc = estimate.__doc__
  for name in estimate.STATISTICS:
    assert f"  {name}" in doc or name in ("min", "median"), name


def test_committed_results_md_is_what_the_declarations_make(tmp_path):
  proc = subprocess.run(
    [sys.executable, "scripts/results_md.py", "--check"],
    cwd=REPO_ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


def _first_commit_date(path) -> datetime.date | None:
  out = subprocess.run(
    ["git", "log", "--diff-filter=A", "--follow", "--format=%cs", "--", str(path)],
    cwd=REPO_ROOT,
    capture_output=True,
    text=True,
    timeout=30,
  )
  dates = out.stdout.split()
  return datetime.date.fromisoformat(dates[-1]) if out.returncode == 0 and dates else None


def test_no_declaration_claims_an_earlier_date_than_git_shows():
  """A declaration cannot be backdated: its `declared` date is no earlier than the day its
  file entered the history (a file not yet committed is skipped)."""
  for claim in estimate.load_claims(render.CLAIMS):
    first = _first_commit_date(render.CLAIMS / claim.path)
    if first is None:
      continue
    for a in claim.analyses:
      assert a.declared >= first, f"{claim.path}:{a.id} declared {a.declared}, committed {first}"


@pytest.mark.slow
def test_claim_notebooks_run_on_the_committed_results(repo_root):
  nbformat = pytest.importorskip("nbformat")
  nbclient = pytest.importorskip("nbclient")
  for path in sorted((repo_root / "notebooks").glob("claim_*.ipynb")):
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), path
    client = nbclient.NotebookClient(
      nb, kernel_name="python3", timeout=120, resources={"metadata": {"path": str(repo_root)}}
    )
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"], path
    md = "".join(o.get("data", {}).get("text/markdown", "") for o in outputs)
    assert "| analysis |" in md, path
    assert any("image/png" in o.get("data", {}) for o in outputs), f"{path}: no figure"


def test_each_mean_gives_one_row_per_unit_with_its_spread(tmp_path):
  results, claims = tmp_path / "results", tmp_path / "claims"
  results.mkdir()
  claims.mkdir()
  doc = {
    "provenance": {"command": "python sweep.py", "time": "2026-12-01T00:00:00+0000"},
    "points": [{"varied": "lr=1", "acc": [0.5, 0.7]}, {"varied": "lr=2", "acc": [0.1, 0.1, 0.4]}],
  }
  (results / "sweep.json").write_text(json.dumps(doc))
  (claims / "s.toml").write_text(
    'key = "s"\ntitle = "sweep"\nseed = "-"\n[[analysis]]\nid = "acc"\nlabel = "accuracy"\n'
    'declared = "2026-12-02"\nfiles = ["sweep.json"]\nunit = "points/*"\nlabel_path = "varied"\n'
    'statistic = "each_mean"\nmetric = "acc/*"\ncommand = "python sweep.py"\n'
  )
  rows = render.evaluate_claim("s", results, claims).rows
  assert [r.label for r in rows] == ["accuracy: lr=1", "accuracy: lr=2"]
  assert [r.estimate.estimate for r in rows] == [pytest.approx(0.6), pytest.approx(0.2)]
  assert rows[1].estimate.se == pytest.approx(0.1)
  assert [(r.retrospective, r.units) for r in rows] == [(1, 1), (1, 1)]
