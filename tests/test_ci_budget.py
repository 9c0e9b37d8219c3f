"""CI's time budget (benchmarks/ci_budget.py) on hand-made profiles: the stage times read from .ci/stages.sh's
lines, the table's shares, and the rule (45 minutes in all; no stage past 1.5x its committed time and 60 s more)."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("ci_budget", ROOT / "benchmarks" / "ci_budget.py")
budget = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(budget)


def profile(total: float, **stages: float) -> dict:
    return {"format": budget.FORMAT, "commit": "abc", "total_s": total,
            "stages": [{"name": n, "seconds": s, "ran": "foreground"} for n, s in stages.items()]}


def test_stage_lines_give_each_stage_its_seconds_and_where_it_ran(tmp_path):
    lines = tmp_path / "stages.tsv"
    lines.write_text("install\t100.0\t130.5\tbackground\npytest\t130.5\t700.5\t\nptx\t700.5\t701.0\tfailed\n")
    assert budget.read_stages(lines) == [{"name": "install", "seconds": 30.5, "ran": "background"},
                                         {"name": "pytest", "seconds": 570.0, "ran": "foreground"},
                                         {"name": "ptx", "seconds": 0.5, "ran": "failed"}]


def test_the_table_gives_each_stage_its_share_of_the_whole_run():
    text = budget.table(profile(800.0, pytest=600.0, ptx=200.0))
    rows = {line.split()[0]: line.split() for line in text.splitlines()[2:]}
    assert rows["pytest"][1:3] == ["600", "75.0%"] and rows["ptx"][1:3] == ["200", "25.0%"]
    assert rows["total"][1:3] == ["800", "100.0%"] and "(13.3 min, commit abc)" in text


@pytest.mark.parametrize("now, problem", [
    (profile(2000.0, pytest=600.0, ptx=30.0), None),                    # as committed
    (profile(45 * 60 + 1.0, pytest=600.0), "total: 45.0 min"),          # past 45 minutes in all
    (profile(2000.0, pytest=901.0), "stage pytest: 901 s, 1.50x"),      # 1.5x and 301 s more: over
    (profile(2000.0, pytest=900.0), None),                              # exactly 1.5x: within
    (profile(2000.0, ptx=80.0), None),                                  # 2.7x, but only 50 s more: noise
    (profile(2000.0, ptx=91.0), "stage ptx: 91 s, 3.03x"),              # 3x and 61 s more: over
    (profile(2000.0, compile=5000.0 / 4), None),                        # a new stage: only the total limits it
])
def test_the_budget_names_the_stage_over_it(now, problem):
    committed = profile(2000.0, pytest=600.0, ptx=30.0)
    found = budget.over_budget(now, committed)
    assert found == ([] if problem is None else [found[0]]) and (problem is None or found[0].startswith(problem))


def test_a_failed_stage_is_not_held_to_its_budget_and_new_stages_are_named():
    committed = profile(2000.0, pytest=600.0)
    now = {**profile(2000.0, compile=10.0), "stages": [{"name": "pytest", "seconds": 5000.0, "ran": "failed"},
                                                      {"name": "compile", "seconds": 10.0, "ran": "foreground"}]}
    assert budget.over_budget(now, committed) == []
    assert budget.new_stages(now, committed) == ["compile"]


def test_the_command_writes_the_profile_and_checks_it_against_the_committed_one(tmp_path, capsys):
    stages = tmp_path / "stages.tsv"
    stages.write_text("pytest\t0\t900\t\n")
    committed = tmp_path / "profile.json"
    committed.write_text(json.dumps(profile(700.0, pytest=500.0)))
    # making the profile again at its committed path: it is read before it is replaced
    code = budget.main(["profile", str(stages), "--start", "0", "--end", "1000", "--out", str(committed),
                        "--check-against", str(committed)])
    assert code == 1 and "stage pytest: 900 s, 1.80x its 500 s" in capsys.readouterr().err
    made = json.loads(committed.read_text())
    assert made["total_s"] == 1000.0 and made["stages"] == [{"name": "pytest", "seconds": 900.0, "ran": "foreground"}]
    assert budget.main(["check", str(committed), "--against", str(committed)]) == 0
    # no committed profile yet: the total alone
    assert budget.main(["check", str(committed), "--against", str(tmp_path / "absent.json")]) == 0
    assert "the total alone" in capsys.readouterr().out



def test_the_committed_profile_is_within_the_budget_and_names_every_stage_of_ci_run():
    committed = budget.read_profile(ROOT / "reports" / "ci" / "profile.json")
    assert committed["total_s"] <= budget.TOTAL_LIMIT_S and budget.over_budget(committed, committed) == []
    script = (ROOT / ".ci" / "run").read_text()
    import re

    stages = set(re.findall(r"^\s*stage(?:_bg)? ([a-z0-9-]+) ", script, flags=re.M))
    assert stages == {s["name"] for s in committed["stages"]}, "make reports/ci/profile.json again (docs/ci.md)"
