"""``parity bisect`` from the test side, on hand-made version rows: a fake installer and a fake measure are handed
to :class:`harness.bisect.history.History` (what the CLI builds from uv and ``parity run``), so nothing is installed
or downloaded. The candidate's rows of a version are fla's committed rows of two peer cases with every error scaled
by that version's factor: 0.5 passes the gate, 4 fails it."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from harness.bisect.envs import InstallFailed
from harness.bisect.history import BisectSettings, History
from harness.bisect.run import bisect, read_log
from harness.bisect.versions import Version, declared_refusal, parse_versions, pypi_versions
from harness.cli import main
from harness.core.metrics import METRICS
from harness.core.policy import policy_from_options
from harness.core.results import read_results

ROOT = Path(__file__).resolve().parents[1]
BASE = read_results(ROOT / "reports/peers/tpu-inference/gpu.csv")
CASES = list(dict.fromkeys(BASE["case_id"]))[:2]
STRICT = policy_from_options(None, None, 0.0, None, 0.0)  # the point rule: one draw decides
LEG = "mylib"  # a candidate of rows only: registered nowhere, its rows name themselves in `versions`


def scaled(rows: pd.DataFrame, factor: float, version: str) -> pd.DataFrame:
    """The baseline's rows as a candidate's whose every error is ``factor`` times fla's."""
    out = rows.copy()
    for metric in METRICS:
        out[metric] = out[metric] * factor
    out["rel_l2_blocks"] = out["rel_l2_blocks"].map(
        lambda text: ";".join(f"{float(x) * factor ** 2:.9e}" for x in str(text).split(";")) if isinstance(text, str)
        else text)
    out["got_at_worst"] = out["ref_at_worst"] - (out["ref_at_worst"] - out["got_at_worst"]) * factor
    out["leg"], out["versions"] = LEG, json.dumps({LEG: version})
    return out


class FakeInstaller:
    def __init__(self, broken=()):
        self.broken, self.installed = set(broken), []

    def install(self, package, version):
        if version.name in self.broken:
            raise InstallFailed("error: No solution found when resolving dependencies")
        self.installed.append(version.name)
        return Path("/nonexistent") / version.name


class FakeMeasure:
    """Rows of each (version, case) from ``factors[version]`` (one factor, or per case), and every call kept."""

    def __init__(self, factors):
        self.factors, self.calls = factors, []

    def __call__(self, site, case_ids, scratch):
        version = site.name
        self.calls += [(version, c) for c in case_ids]
        f = self.factors[version]
        frames = [scaled(BASE[BASE.case_id == c], f[c] if isinstance(f, dict) else f, version) for c in case_ids]
        return pd.concat(frames, ignore_index=True)


def history(tmp_path, factors, *, broken=(), refused=None, sweep=False, skip=(), measure=None, **marks):
    versions = tuple(Version(v, f"mylib=={v}", date=f"2026-0{i + 1}-01") for i, v in enumerate(factors))
    settings = BisectSettings(leg=LEG, package="mylib", versions=versions, out=tmp_path, policy=STRICT,
                              baseline_leg="gpu", sweep=sweep, skip=tuple(skip), argv=("--candidate", LEG), **marks)
    measure = measure or FakeMeasure(factors)
    refusal = (lambda v: refused.get(v)) if refused else (lambda v: None)
    return History(settings, CASES, BASE, FakeInstaller(broken), measure, refusal, say=lambda line: None), measure


def first_o(found, case=CASES[0]):
    return next(c for c in found["crossings"] if c.case_id == case and c.tensor == "o")


def test_one_flip_bisected_and_swept(tmp_path):
    factors = {"1.0": 0.5, "1.1": 0.5, "1.2": 0.5, "1.3": 4.0, "1.4": 4.0, "1.5": 4.0}
    h, measure = history(tmp_path / "b", factors)
    found = bisect(h)
    c = first_o(found)
    assert (c.before, c.after, c.verdict_before, c.verdict_after) == ("1.2", "1.3", "pass", "fail")
    assert c.ratio_after == pytest.approx(4.0) and c.ratio_before == pytest.approx(0.5)  # ratios to fla
    assert {v for v, _ in measure.calls} < set(factors)  # bisection measures fewer versions than the sweep
    sweep, _ = history(tmp_path / "s", factors, sweep=True)
    all_found = bisect(sweep)
    assert [(c.before, c.after) for c in all_found["crossings"] if c.case_id == CASES[0] and c.tensor == "o"] \
        == [("1.2", "1.3")]
    for name in ("history.csv", "history.md", "history.png", "history.html", "crossings.csv", "bisect-log.txt"):
        assert (tmp_path / "s" / name).stat().st_size > 0
    md = (tmp_path / "s" / "history.md").read_text()
    assert "first changes verdict at **1.3**" in md and "parity bisect --candidate mylib --versions" in md
    assert "2026-04-01" in md  # the dates stored with the versions
    assert "data:image/png;base64," in (tmp_path / "s" / "history.html").read_text()


def test_two_flips(tmp_path):
    """pass, fail, fail, pass: the sweep shows both crossings; the bisection finds one and says it is one of
    several."""
    factors = {"1.0": 0.5, "1.1": 4.0, "1.2": 4.0, "1.3": 0.5}
    found = bisect(history(tmp_path / "s", factors, sweep=True)[0])
    pairs = [(c.before, c.after, c.verdict_after) for c in found["crossings"]
             if c.case_id == CASES[0] and c.tensor == "o"]
    assert pairs == [("1.0", "1.1", "fail"), ("1.2", "1.3", "pass")]
    c = first_o(bisect(history(tmp_path / "b", factors)[0]))
    assert (c.before, c.after) == ("1.0", "1.1")
    assert c.changes_seen == 2 and "not monotone" in c.note and "one of the crossings" in c.note


def test_unsupported_and_install_failure_are_rows_and_skipped(tmp_path):
    factors = {"1.0": 0.5, "1.1": 0.5, "1.2": 4.0, "1.3": 4.0, "1.4": 4.0}
    h, measure = history(tmp_path, factors, broken={"1.2"}, refused={"1.1": "no kernel before 1.2"}, sweep=True)
    found = bisect(h)
    rows = read_results(tmp_path / "versions/1.1/rows.csv")
    assert (rows.status == "unsupported").all() and rows.reason.str.contains("no kernel before 1.2").all()
    rows = read_results(tmp_path / "versions/1.2/rows.csv")
    assert (rows.status == "error").all()
    assert rows.reason.str.startswith("install failed: error: No solution found").all()
    assert set(found["unjudged"]) == {"1.1", "1.2"}
    assert not any(v in ("1.1", "1.2") for v, _ in measure.calls)
    c = first_o(found)
    assert (c.before, c.after, c.unjudged) == ("1.0", "1.3", ["1.1", "1.2"])
    # the bisection steps over them too, and says which versions it could not judge
    c = first_o(bisect(history(tmp_path / "b", factors, broken={"1.2"}, refused={"1.1": "no"})[0]))
    assert (c.before, c.after) == ("1.0", "1.3") and "1.1, 1.2 could not be judged" in c.note
    state = json.loads((tmp_path / "bisect.json").read_text())
    assert {v["version"]: v.get("state") for v in state["versions"]}["1.2"] == "install_failed"


def test_resume_never_measures_a_version_case_twice(tmp_path):
    factors = {"1.0": 0.5, "1.1": 4.0, "1.2": 4.0}
    h, measure = history(tmp_path, factors, sweep=True)
    h.case_ids = CASES[:1]  # a first run over one case (as if cut short after it)
    bisect(h)
    assert sorted(measure.calls) == [(v, CASES[0]) for v in factors]
    again, measure2 = history(tmp_path, factors, sweep=True)
    found = bisect(again)
    assert sorted(measure2.calls) == [(v, CASES[1]) for v in factors]  # only the case not yet measured
    third, measure3 = history(tmp_path, factors, sweep=True)
    assert bisect(third)["table"].equals(found["table"]) and measure3.calls == []


def test_log_replays_its_marks(tmp_path):
    factors = {"1.0": 0.5, "1.1": 0.5, "1.2": 4.0}
    bisect(history(tmp_path, factors, skip=("1.1",))[0])
    log = (tmp_path / "bisect-log.txt").read_text()
    argv, marks = read_log(log + "good 1.0\n")
    assert argv == ["--candidate", LEG] and marks == {"good": "1.0", "bad": None, "skip": ["1.1"]}
    assert "first-new 1.2" in log


def test_versions_parsing_and_refusals():
    assert parse_versions("tpu-inference==0.20.0,0.21.0")[2] == ["0.20.0", "0.21.0"]
    doc = {"releases": {"0.19.0": [{"upload_time_iso_8601": "2026-05-05T21:26:29Z", "yanked": False}],
                        "0.22.0": [{"upload_time_iso_8601": "2026-06-08T08:42:03Z", "yanked": True,
                                    "yanked_reason": ""}],
                        "0.22.1": [{"upload_time_iso_8601": "2026-06-16T05:58:10Z", "yanked": False}],
                        "0.23.0rc1": [{"upload_time_iso_8601": "2026-06-22T07:40:37Z", "yanked": False}],
                        "0.40.0": []}}
    dist, versions, notes = pypi_versions("tpu-inference>=0.19", fetch=lambda name: doc)
    assert [v.name for v in versions] == ["0.19.0", "0.22.1"] and versions[1].date.startswith("2026-06-16")
    assert any("0.22.0" in n for n in notes) and any("pre-release" in n for n in notes)
    refusal = declared_refusal([("<0.20", "no kernel"), (">=0.24,<0.29", "old signature")])
    assert refusal("0.19.0") == "no kernel" and refusal("0.25.0") == "old signature" and refusal("0.29.0") is None
    assert refusal("0123abcd") is None


@pytest.mark.parametrize("argv, says", [
    (["bisect", "--candidate", "nosuchleg", "--versions", "x==1,2"], "unknown leg"),
    (["bisect", "--candidate", "tpu-inference"], "give the versions"),
    (["bisect", "--candidate", "tpu-inference", "--git", "."], "go together"),
    (["bisect", "--candidate", "tpu-inference", "--versions", "tpu-inference==1.0,x.y"], "not a version"),
    (["bisect", "--candidate", "ref", "--versions", "a==1,2"], "is the reference leg"),
    (["bisect", "--candidate", "tpu-inference", "--git", ".", "--commits", "HEAD"], "must be A..B"),
    (["bisect", "--replay", "/nonexistent/log"], "No such file"),
    (["bisect", "--versions", "a==1,2"], "--candidate LEG"),
])
def test_bad_input_is_one_line_and_exit_2(argv, says, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1, err


def test_settings_refuse_marks_outside_the_versions(tmp_path):
    with pytest.raises(ValueError, match="--good 9.9 is not one of the versions"):
        history(tmp_path, {"1.0": 1, "1.1": 1}, good="9.9")
    with pytest.raises(ValueError, match="must come before"):
        history(tmp_path, {"1.0": 1, "1.1": 1}, good="1.1", bad="1.0")


def test_tpu_inference_bindings_refuse_the_releases_they_cannot_map():
    """What each generation's binding declares (read from the wheels: docs/bisect.md, reports/bisect/tpu-inference)."""
    from peers.tpu_inference import IMPLEMENTATION, V2, V3

    v1, v2, v3 = (declared_refusal(i.version_refusals) for i in (IMPLEMENTATION, V2, V3))
    assert "PR #2157" in v1("0.19.0") and v1("0.18.0") and v1("0.13.3")
    assert v1("0.20.0") is None and v1("0.32.0") is None and v1("0.18.0.dev20260505") is None
    assert "has_initial_state" in v1("0.18.0.dev20260427")
    assert v2("0.21.0") and v2("0.22.1") is None
    assert v3("0.23.0") and "read_state_indices" in v3("0.28.0") and v3("0.29.0") is None


def test_a_version_whose_binding_errors_is_not_judged(tmp_path):
    """A case that raises at a version (an API the binding does not fit) fails the gate closed; the history shows
    ``error`` with the reason and steps over it: no crossing is made of it."""

    class Errors(FakeMeasure):
        def __call__(self, site, case_ids, scratch):
            rows = super().__call__(site, case_ids, scratch)
            if site.name == "1.1":
                for column in METRICS + ("rel_l2_blocks", "worst_index", "ref_at_worst", "got_at_worst"):
                    rows[column] = None
                rows["status"], rows["reason"] = "error", "TypeError: f() got an unexpected keyword argument 'x'"
            return rows

    factors = {"1.0": 0.5, "1.1": 0.5, "1.2": 0.5}
    found = bisect(history(tmp_path, factors, sweep=True, measure=Errors(factors))[0])
    table = found["table"]
    mine = table[(table.case_id == CASES[0]) & (table.tensor == "o")].set_index("version")
    assert list(mine.verdict) == ["pass", "error", "pass"] and "unexpected keyword" in mine.reason["1.1"]
    assert all(c.after is None for c in found["crossings"])  # no change of verdict: 1.1 is not judged


def test_a_run_that_ends_without_rows_is_not_judged_nor_stored(tmp_path):
    """A version whose ``parity run`` makes no rows (its package does not import on this stack): ``run_failed``,
    error rows that say how, not stored, so the next bisection runs it again."""
    from harness.bisect.envs import RunFailed

    class Fails(FakeMeasure):
        def __call__(self, site, case_ids, scratch):
            if site.name == "1.1":
                self.calls += [(site.name, c) for c in case_ids]
                raise RunFailed("parity run exited 2 without rows: parity: error: key contains names that are not "
                                "kernel arguments")
            return super().__call__(site, case_ids, scratch)

    factors = {"1.0": 0.5, "1.1": 4.0, "1.2": 0.5}
    found = bisect(history(tmp_path, factors, sweep=True, measure=Fails(factors))[0])
    assert "1.1" in found["unjudged"] and not (tmp_path / "versions/1.1/rows.csv").exists()
    assert set(found["table"][found["table"].version == "1.1"].verdict) == {"run_failed"}
    assert all(c.after is None for c in found["crossings"])
    again, measure = history(tmp_path, factors, sweep=True, measure=Fails(factors))
    bisect(again)
    assert {v for v, _ in measure.calls} == {"1.1"}  # tried again; 1.0 and 1.2 served from their rows


def test_a_version_whose_binding_refuses_every_case_at_run_time_reads_refused_with_its_reason(tmp_path):
    """An installed version whose binding refuses each case when it runs (a module the version lacks): the
    history's versions table says ``refused`` and why, not ``installed`` with an empty reason."""

    class Lacks(FakeMeasure):
        def __call__(self, site, case_ids, scratch):
            rows = super().__call__(site, case_ids, scratch)
            if site.name == "1.0":
                for column in METRICS + ("rel_l2_blocks", "worst_index", "ref_at_worst", "got_at_worst"):
                    rows[column] = None
                rows["status"], rows["reason"] = "unsupported", "the installed mylib 1.0 has no mylib.ops.kda"
            return rows

    factors = {"1.0": 0.5, "1.1": 0.5, "1.2": 0.5}
    found = bisect(history(tmp_path, factors, sweep=True, measure=Lacks(factors))[0])
    states = {v["version"]: v for v in json.loads((tmp_path / "bisect.json").read_text())["versions"]}
    assert states["1.0"]["state"] == "refused" and states["1.0"]["reason"] == "the installed mylib 1.0 has no mylib.ops.kda"
    assert states["1.1"]["state"] == "installed" and "1.0" in found["unjudged"]
