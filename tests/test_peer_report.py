"""The own-tests rule of peers.md (harness.report.peer_report): declared by each implementation (its ``tests_rule``,
recorded in its rows' settings), read back from the rows, and applied to the same numbers; none declared, no
value. tpu-inference's declared rule gives its committed report's own-rule column unchanged."""

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from harness.report.peer_report import own_rule, peer_markdown, peer_table, rule_for
from harness.core.policy import default_policy

ROOT = Path(__file__).resolve().parents[1]
SG = "simple_gla.chunk/B1-T{T}-H1-K128-V128/bf16/g_gamma=alibi(L32,l0)/C64/h0,dht"
TOPS_LIKE = {"summary": "tops-like", "relative_to": "candidate",
             "by_variant": {"simple_gla.chunk": {"test": "t.py",
                                                 "o": {"atol": 1e-2, "atol_per_chunk": 1e-2, "atol_max": 5e-2,
                                                       "rtol": 5e-2, "max_ulp": 4, "ulp_dtype": "bfloat16"},
                                                 "ht": {"atol": 5e-2, "rtol": 5e-2}}}}
ALLCLOSE = {"summary": "allclose(atol = rtol = 1e-2)", "default": {"atol": 1e-2, "rtol": 1e-2}}


def row(max_abs, got, ref):
    return {"max_abs": max_abs, "got_at_worst": got, "ref_at_worst": ref}


def test_the_atol_follows_the_chunk_count_and_its_cap_and_each_tensor_has_its_own():
    assert rule_for(TOPS_LIKE, SG.format(T=64), "o")["atol"] == pytest.approx(2e-2)  # 1 chunk
    assert rule_for(TOPS_LIKE, SG.format(T=100), "o")["atol"] == pytest.approx(2e-2)  # T // C = 1
    assert rule_for(TOPS_LIKE, SG.format(T=192), "o")["atol"] == pytest.approx(4e-2)
    assert rule_for(TOPS_LIKE, SG.format(T=1024), "o")["atol"] == pytest.approx(5e-2)  # capped
    assert rule_for(TOPS_LIKE, SG.format(T=64), "ht")["atol"] == pytest.approx(5e-2)
    assert rule_for(TOPS_LIKE, SG.format(T=64), "dq") is None  # no rule for that tensor
    assert rule_for(TOPS_LIKE, "gla.chunk/B1-T64-H1-K128-V128/bf16/g=logsigmoid/16/C64", "o") is None
    assert rule_for(None, SG.format(T=64), "o") is None
    assert rule_for(ALLCLOSE, "kda.chunk/B1-T64-H2-K128-V128/fp32/g=logsigmoid/16/C64/dht", "ht")["atol"] == 1e-2


def test_pass_fail_and_undecided_from_the_rows():
    rule = rule_for(ALLCLOSE, SG.format(T=64), "o")
    assert own_rule(row(0.009, 1.0, 1.009), rule) == "pass"  # max_abs within atol: every element is
    assert own_rule(row(0.5, 0.0, 0.5), rule) == "FAIL"  # the worst element breaks it
    assert own_rule(row(0.02, 10.0, 10.02), rule) == "undecided"  # worst element within rtol; others unknown
    assert own_rule(row(None, None, None), rule) == ""  # an error row
    assert own_rule(row(0.5, 0.0, 0.5), None) == ""  # no rule declared: no value


def test_rtol_scales_the_candidates_value_or_the_references_as_declared():
    loose = {"default": {"atol": 1e-2, "rtol": 0.5}}
    # |got - ref| = 0.1: within 1e-2 + 0.5 * |ref| = 0.11, beyond 1e-2 + 0.5 * |got| = 0.06
    assert own_rule(row(0.1, 0.1, 0.2), rule_for(loose, SG.format(T=64), "o")) == "undecided"
    assert own_rule(row(0.1, 0.1, 0.2), rule_for({**loose, "relative_to": "candidate"}, SG.format(T=64), "o")) \
        == "FAIL"


def test_an_element_within_max_ulp_bf16_ulps_passes():
    ulps = {"default": {"atol": 1e-2, "rtol": 0.0, "max_ulp": 4, "ulp_dtype": "bfloat16"}}
    rule = rule_for(ulps, SG.format(T=64), "o")
    # at |x| in [1, 2) a bf16 ULP is 2^-7: 4 ULPs = 0.03125 cover |got - ref| = 0.02, atol 1e-2 does not
    assert own_rule(row(0.02, 1.0, 1.02), rule) == "undecided"
    assert own_rule(row(0.02, 1.0, 1.02), {**rule, "max_ulp": 0}) == "FAIL"
    assert own_rule(row(0.04, 1.0, 1.04), rule) == "FAIL"


def frames(rule_of):
    """Hand-made rows of a baseline and two candidates, ``rule_of[leg]`` recorded in each one's settings."""
    def rows(leg, eps, max_abs, rule):
        settings = json.dumps({"tests_rule": rule} if rule else {})
        return pd.DataFrame([{"case_id": SG.format(T=64), "tensor": "o", "leg": leg, "status": "ok",
                              "reason": None, "rel_l2": eps, "max_abs": max_abs, "got_at_worst": 0.0,
                              "ref_at_worst": max_abs, "ulp_max": 1, "ulp_mean": 1, "compiled_for": "v6e",
                              "settings": settings, "input_sha256": "x"}])
    return (rows("gpu", 1e-2, 0.03, None),
            [rows("tpu", 5e-3, 0.015, rule_of.get("tpu")), rows("peer", 2e-2, 0.03, rule_of.get("peer"))])


@pytest.fixture
def table(monkeypatch):
    import harness.report.peer_report as pr

    class Gate:  # the gate is not what these tests are about
        def __init__(self, cand):
            self.parity = pd.DataFrame({"case_id": cand["case_id"], "tensor": cand["tensor"], "metric": "rel_l2",
                                        "verdict": "pass"})
    monkeypatch.setattr(pr, "apply_gate", lambda base, cand, policy, **kw: Gate(cand))

    def make(rule_of):
        base, cands = frames(rule_of)
        return peer_table(base, cands, default_policy())
    return make


def test_one_peers_rule_is_applied_to_every_candidate(table):
    t = table({"peer": ALLCLOSE})
    assert dict(zip(t.candidate, t.own_tests_rule)) == {"tpu": "FAIL", "peer": "FAIL"}
    assert "'own rule' is allclose(atol = rtol = 1e-2)." in peer_markdown(t, "x")


def test_different_rules_each_its_own_and_none_without_a_declaration(table):
    t = table({"peer": ALLCLOSE, "tpu": {"summary": "loose", "default": {"atol": 1.0, "rtol": 0.0}}})
    assert dict(zip(t.candidate, t.own_tests_rule)) == {"tpu": "pass", "peer": "FAIL"}
    assert "tpu: loose; peer: allclose" in peer_markdown(t, "x")
    t = table({})
    assert set(t.own_tests_rule) == {""}
    assert "no candidate declares its own tests' rule" in peer_markdown(t, "x")
    assert "own rule –" in peer_markdown(t, "x")


def test_tpu_inference_declares_its_rule_and_its_report_keeps_its_own_rule_column():
    """Its committed rows, with the rule its binding now declares recorded in their settings, give its committed
    peers.csv's own-rule column and peers.md's own-rule words unchanged (verdict words aside: the policy moved)."""
    from peers.tpu_inference import TpuInference

    d = ROOT / "reports/peers/tpu-inference"
    gpu, tpu, ti = (pd.read_csv(d / f) for f in ("gpu.csv", "tpu.csv", "tpu-inference.csv"))
    ti["settings"] = ti["settings"].map(lambda s: json.dumps({**json.loads(s), "tests_rule": TpuInference.tests_rule}))
    t = peer_table(gpu, [tpu, ti], default_policy())
    before = pd.read_csv(d / "peers.csv")
    assert list(t.own_tests_rule.fillna("")) == list(before.own_tests_rule.fillna(""))
    verdicts = re.compile(r"\*\*\w+\*\*")
    assert verdicts.sub("", peer_markdown(t, "Candidates against fla: tpu-inference")) == \
        verdicts.sub("", (d / "peers.md").read_text())
