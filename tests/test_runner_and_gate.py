"""Rows for every outcome, and the gate's verdicts, on a tiny simple_gla case with fake legs."""


import numpy as np
import pandas as pd
import pytest

from cases.case import Case, Gate
from cases.inputs import make_inputs
from harness.cli import main
from harness.judge.gate import GateInputError, apply_gate
from harness.legs import leg_spec, make_leg
from harness.legs.base import Environment, Leg, LegOutput
from harness.ops import get_op
from harness.core.policy import Policy
from harness.run.recipe import LegRecipe
from harness.run.reference_cache import ReferenceCache
from harness.core.results import read_results, rows_to_frame, settings_values, write_csv
from harness.run.runner import Runner
from harness.app.workers import Workers

CASE = Case("simple_gla", "chunk", B=1, T=16, H=2, K=8, V=8, dtype="float32", gate=Gate(), chunk_size=8,
            h0=True, dht=True)


class FakeLeg(Leg):
    """Returns the golden result, transformed per tensor by ``edit``."""

    def __init__(self, name="tpu", edit=None, raise_exc=None, unsupported=None):
        self.name, self.edit, self.raise_exc, self.unsupported = name, edit or {}, raise_exc, unsupported
        self.cache = ReferenceCache(None)

    def environment(self):
        return Environment(mode="emulated", device="fake", versions={leg_spec(self.name).version_key: "fake"})

    def supports(self, op, case):
        return self.unsupported

    def run(self, op, case, inputs):
        if self.raise_exc:
            raise self.raise_exc
        golden = self.cache.get(op, case, inputs)
        out = {}
        for name, value in golden.items():
            f = self.edit.get(name, lambda x: x * (1 + 1e-6))
            out[name] = f(value)
        return LegOutput(out, {"fake": True})


def _rows(leg):
    return {r["tensor"]: r for r in Runner(leg, ReferenceCache(None)).run_case(CASE)}


def test_ok_rows_carry_metrics_and_provenance():
    rows = _rows(FakeLeg())
    assert set(rows) == {"o", "ht", "dq", "dk", "dv", "dg", "dh0"}
    r = rows["o"]
    assert r["status"] == "ok" and r["mode"] == "emulated" and len(r["input_sha256"]) == 64
    assert r["rel_l2"] == pytest.approx(1e-6, rel=1e-6)
    assert r["repro"] == f"parity run --backend tpu --case '{CASE.id}'"


def test_each_failure_class_becomes_a_row():
    rows = _rows(FakeLeg(edit={
        "dg": lambda x: np.zeros_like(x),  # the "dg returned as zeros" bug
        "o": lambda x: np.where(np.arange(x.size).reshape(x.shape) == 3, np.nan, x),
        "dh0": lambda x: None,
    }))
    assert rows["dg"]["status"] == "bound" and rows["dg"]["rel_l2"] == 1.0
    assert rows["o"]["status"] == "nonfinite" and rows["o"]["nan"] == 1
    assert rows["dh0"]["status"] == "not_provided"
    assert rows["dq"]["status"] == "ok"


def test_unsupported_and_error_rows_do_not_stop_the_run():
    rows = _rows(FakeLeg(unsupported="TPU kernels need K and V to be multiples of 128"))
    assert {r["status"] for r in rows.values()} == {"unsupported"}
    assert "multiples of 128" in rows["o"]["reason"]
    rows = _rows(FakeLeg(raise_exc=RuntimeError("kernel exploded")))
    assert {r["status"] for r in rows.values()} == {"error"}
    assert "RuntimeError: kernel exploded" in rows["o"]["reason"]
    rows = _rows(FakeLeg(raise_exc=NotImplementedError("K=64 not supported")))
    assert {r["status"] for r in rows.values()} == {"unsupported"}
    # an invalid case is an error row too, and the run goes on to the next case
    bad = CASE.replace(variant="nope")
    all_rows = []  # through the command's own loop (harness.app.workers), in this process
    Workers(1).run(Runner(FakeLeg(), ReferenceCache(None)), LegRecipe(FakeLeg().name), [bad, CASE],
                   on_case=lambda case, rows: all_rows.extend(rows))
    assert all_rows[0]["status"] == "error" and "variant" in all_rows[0]["reason"]
    assert all_rows[-1]["status"] == "ok"


def result_frame(leg, case=CASE, **kw):
    return rows_to_frame(Runner(FakeLeg(leg, **kw), ReferenceCache(None)).run_case(case))


def test_gate_verdicts():
    gpu = result_frame("gpu", edit={"dg": lambda x: x * (1 + 1e-5), "dh0": lambda x: None})
    tpu = result_frame("tpu", edit={"dq": lambda x: x * (1 + 1e-5), "dk": lambda x: np.zeros_like(x)})
    res = apply_gate(gpu, tpu, Policy())
    v = {(r["tensor"], r["metric"]): r for r in res.parity.to_dict("records")}
    assert v[("o", "rel_l2")]["verdict"] == "pass"  # equal errors pass the strict rule
    assert v[("o", "ulp_p99")]["verdict"] == "info"  # reported, not gated
    assert v[("dq", "rel_l2")]["verdict"] == "fail" and v[("dq", "rel_l2")]["ratio"] == pytest.approx(10, rel=1e-3)
    assert v[("dg", "rel_l2")]["verdict"] == "pass"
    assert v[("dk", "status")]["verdict"] == "fail" and "bound" in v[("dk", "status")]["reason"]
    assert v[("dh0", "status")]["verdict"] == "bounds_only"  # no GPU number, TPU within bounds
    assert not res.passed
    # a relative margin of 10x lets dq through; dk still fails on its absolute bound
    res = apply_gate(gpu, tpu, Policy(rel_margin=10.0))
    assert set(res.failures["tensor"]) == {"dk"}


def test_gate_refuses_stale_baseline():
    gpu = result_frame("gpu")
    tpu = result_frame("tpu")
    gpu["input_sha256"] = "0" * 64
    with pytest.raises(GateInputError, match="different inputs") as info:
        apply_gate(gpu, tpu, Policy())
    assert CASE.id in str(info.value)


def test_gate_unsupported_and_missing():
    gpu = result_frame("gpu")
    tpu = result_frame("tpu", unsupported="TPU kernels need K and V to be multiples of 128")
    res = apply_gate(gpu, tpu, Policy())
    # every row unsupported: nothing was compared, and a gate that measured nothing fails
    assert set(res.parity["verdict"]) == {"unsupported", "fail"} and not res.passed
    assert list(res.failures["metric"]) == ["coverage"]
    res = apply_gate(gpu, tpu.iloc[:0], Policy())
    assert not res.passed and "not in the candidate" in res.failures["reason"].iloc[0]
    res = apply_gate(gpu, tpu.iloc[:0], Policy(), allow_missing=True)
    assert set(res.parity["verdict"]) == {"missing", "fail"}  # still nothing compared


def test_cli_gate_exit_codes(tmp_path):
    gpu, tpu = result_frame("gpu"), result_frame("tpu", edit={"o": lambda x: x * (1 + 1e-3)})
    write_csv(gpu, tmp_path / "gpu.csv")
    write_csv(tpu, tmp_path / "tpu.csv")
    # the strict rule (no noise allowance): a draw's failure is final, exit 1
    assert main(["gate", str(tmp_path / "gpu.csv"), str(tmp_path / "tpu.csv"), "--out", str(tmp_path),
                 "--alpha", "0"]) == 1
    parity = pd.read_csv(tmp_path / "parity.csv")
    assert list(parity.columns[:8]) == ["case_id", "tensor", "metric", "eps_gpu", "eps_tpu", "ratio", "ratio_lower",
                                       "allowed"]
    md = (tmp_path / "parity.md").read_text()
    assert "FAIL" in md and "not hardware numbers" in md and "parity run --backend tpu" in md
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    assert main(["gate", str(tmp_path / "gpu.csv"), str(tmp_path / "other.csv"), "--out", str(tmp_path)]) == 2
    assert main(["gate", str(tmp_path / "gpu.csv"), str(tmp_path / "nope.csv"), "--out", str(tmp_path)]) == 2
    stale = gpu.copy()
    stale["input_sha256"] = "f" * 64
    write_csv(stale, tmp_path / "stale.csv")
    assert main(["gate", str(tmp_path / "stale.csv"), str(tmp_path / "tpu.csv"), "--out", str(tmp_path)]) == 2
    assert main(["gate", str(tmp_path / "gpu.csv"), str(tmp_path / "tpu.csv"), "--out", str(tmp_path),
                 "--floor", "rel_l2=2e-3,max_abs=1"]) == 0
    # with a noise allowance one draw's failure is not decided: exit 3, never a pass, naming the draws needed
    assert main(["gate", str(tmp_path / "gpu.csv"), str(tmp_path / "tpu.csv"), "--out", str(tmp_path),
                 "--alpha", "0.01"]) == 3
    md = (tmp_path / "parity.md").read_text()
    assert "INCONCLUSIVE" in md and "--draws 3" in md


def test_csv_round_trip_keeps_metrics(tmp_path):
    df = result_frame("tpu")
    back = read_results(write_csv(df, tmp_path / "tpu.csv"))
    for metric in ("rel_l2", "max_abs", "ulp_p99"):  # bit-exact: the gate compares values read back
        np.testing.assert_array_equal(back[metric].to_numpy(float), df[metric].to_numpy(float))


def test_cli_usage_errors(capsys):
    assert main(["run", "--backend", "ref", "--suite", "nope"]) == 2
    assert "unknown suite" in capsys.readouterr().err
    assert main(["run", "--backend", "ref", "--shard", "3/2"]) == 2
    assert main(["bogus"]) == 2
    for verb in ("cases", "run", "gate", "merge", "all"):
        assert main([verb, "--help"]) == 0


def test_cli_cases_lists_tensors(capsys):
    assert main(["cases", "--suite", "smoke", "--op", "simple_gla"]) == 0
    out = capsys.readouterr().out
    assert "simple_gla.chunk/B1-T256-H2-K128-V128/bf16/g_gamma=alibi(L32,l0)/C128/h0" in out
    assert "dg_gamma" in out


def test_op_takes_a_comma_list_as_suite_does(capsys):
    """``--op a,b`` selects what ``--op a --op b`` selects, and names its result file the same; an unknown op in
    the list is a usage error, not a silently smaller selection."""
    from harness.app import Selection

    assert main(["cases", "--suite", "smoke", "--op", "simple_gla,gla"]) == 0
    joined = capsys.readouterr().out
    assert main(["cases", "--suite", "smoke", "--op", "simple_gla", "--op", "gla"]) == 0
    assert capsys.readouterr().out == joined
    assert {line.split(".")[0] for line in joined.splitlines()} == {"simple_gla", "gla"}
    assert Selection(ops=("gla, simple_gla",)).result_name("ref") == "ref.op-gla+simple_gla.csv"
    assert main(["cases", "--suite", "smoke", "--op", "simple_gla,glq"]) == 2
    assert "unknown op 'glq'" in capsys.readouterr().err


def test_reference_cache_on_disk(tmp_path):
    op = get_op(CASE.op)
    inputs = make_inputs(CASE, op.inputs(CASE))
    a = ReferenceCache(tmp_path).get(op, CASE, inputs)
    cache = ReferenceCache(tmp_path)
    b = cache.get(op, CASE, inputs)
    assert cache.hits == 1 and cache.misses == 0
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
        assert b[name].dtype == np.float64


@pytest.mark.needs_leg("gpu")
def test_gpu_leg_refuses_when_fla_may_leave_triton(monkeypatch):
    """fla's backend dispatch must stay off: otherwise the GPU numbers are not fla's Triton kernels."""
    from cases.suites import get_suite
    from harness.legs.gpu import FLA_DISPATCH_ENV
    from harness.ops import get_op

    case = next(c for c in get_suite("smoke") if c.op == "kda")
    # the first leg imports fla with dispatch off, as every run does: fla reads the setting once, at import,
    # so this test must never be the one that imports it with dispatch on (that would hold for the process)
    assert make_leg("gpu").supports(get_op("kda"), case) is None
    monkeypatch.setenv(FLA_DISPATCH_ENV, "0")
    reason = make_leg("gpu").supports(get_op("kda"), case)
    assert reason and reason.startswith(f"{FLA_DISPATCH_ENV}='0'")


def test_parity_all_gates_each_candidate_on_the_draws_it_ran():
    """With several candidates, ``parity all`` draws more of a case to decide one candidate's comparison; the
    baseline then holds draws another candidate never ran. Each candidate is gated on the selected cases and its
    own draws (``drawn_by``, harness.judge.sequential); its draw 0 missing still fails, and so does a tensor missing from a draw it ran."""
    from harness.judge.sequential import drawn_by as _drawn_by

    drawn = CASE.replace(seed=1)
    gpu = pd.concat([result_frame("gpu"), result_frame("gpu", case=drawn)], ignore_index=True)
    tpu = result_frame("tpu")
    assert set(_drawn_by(gpu, tpu, [CASE])["case_id"]) == {CASE.id}
    assert apply_gate(_drawn_by(gpu, tpu, [CASE]), tpu, Policy()).passed
    assert not apply_gate(gpu, tpu, Policy()).passed  # the files alone: the draw is missing, and fails
    both = pd.concat([tpu, result_frame("tpu", case=drawn)], ignore_index=True)
    partial = both[~((both["case_id"] == drawn.id) & (both["tensor"] == "dq"))]
    res = apply_gate(_drawn_by(gpu, partial, [CASE]), partial, Policy())
    assert not res.passed and list(res.failures[["case_id", "tensor"]].itertuples(index=False)) == [(drawn.id, "dq")]
    only_drawn = result_frame("tpu", case=drawn)
    res = apply_gate(_drawn_by(gpu, only_drawn, [CASE]), only_drawn, Policy())
    assert not res.passed and set(res.failures["case_id"]) == {CASE.id}


def test_an_error_carrying_a_callbacks_traceback_is_named_by_the_inner_exception():
    """jax's CpuCallback errors embed the traceback of what a callback raised (Pallas's TPU interpreter checks
    run as callbacks): the row's reason is that exception, not the first frame of its traceback."""
    from harness.run.runner import short_error

    inner = ("INTERNAL: CpuCallback error calling callback: Traceback (most recent call last):\n"
             '  File "/x/callback.py", line 816, in _wrapped_callback\n'
             '  File "/x/interpret_pallas_call.py", line 290, in _check_for_revisiting\n'
             "RuntimeError: Revisited block (0, 1) of output 0 in iteration (1, 0, 0).\n"
             "The block was previously visited in iterations (0, 0, 1).")
    assert short_error(RuntimeError(inner)) == (
        "RuntimeError: in a callback, RuntimeError: Revisited block (0, 1) of output 0 in iteration (1, 0, 0). The "
        "block was previously visited in iterations (0, 0, 1).")
    assert short_error(ValueError("plain\nmessage")) == "ValueError: plain message"


def test_settings_values_reads_one_key_of_the_rows_settings():
    """One key of the rows' settings JSON: distinct settings in first-seen order; unparsable, non-object or
    key-less settings, and an absent column, give nothing."""
    df = pd.DataFrame({"settings": ['{"platform": "gpu", "a": 1}', '{"a": 2}', '{"platform": "gpu", "a": 1}',
                                    "not json", "[1, 2]", None, '{"platform": {"x": 1}}']})
    assert settings_values(df, "platform") == ["gpu", {"x": 1}]
    assert settings_values(df, "a") == [1, 2]
    assert settings_values(pd.DataFrame({"x": [1]}), "platform") == []


def test_a_new_case_drops_the_compiles_when_mappings_run_short_and_a_new_draw_keeps_them(monkeypatch):
    """A long run must not exhaust the process's memory mappings (each compiled function holds some; a process
    has 65530), and the draws of one case reuse their compiles: jax's caches are cleared only on a case that
    differs in more than its seed, and only once the mappings pass half the limit."""
    import jax

    import harness.run.runner

    assert 0 < harness.run.runner.mapping_share() < 0.5  # this process's own, read from /proc
    cleared, share = [], [0.4]
    monkeypatch.setattr(jax, "clear_caches", lambda: cleared.append(True))
    monkeypatch.setattr(harness.run.runner, "mapping_share", lambda: share[0])
    runner = Runner(FakeLeg(), ReferenceCache(None))
    other = CASE.replace(T=24)
    for case, at, clears in [(CASE.replace(seed=500), 0.4, 0), (other, 0.4, 0),  # a short run keeps its compiles
                             (CASE.replace(seed=500), 0.6, 1), (CASE.replace(seed=501), 0.6, 1), (CASE, 0.6, 1),
                             (other.replace(seed=500), 0.6, 2), (other.replace(seed=501), 0.6, 2),
                             (CASE.replace(variant="nope"), 0.6, 3)]:
        share[0] = at
        runner.run_case(case)
        assert len(cleared) == clears, case.id
