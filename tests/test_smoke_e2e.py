"""The main job end to end: `parity all --suite smoke`, every leg emulated on this CPU.

One run (about 5-10 minutes on 2 cores) feeds every check below. The checks
run inside a single test so that pytest-xdist never repeats the run on a
second worker (module fixtures are per worker); each check names itself.
"""

import json

import pandas as pd
import pytest

from cases.case import Case
from cases.suites import get_suite
from harness.cli import main
from harness.judge.gate import apply_gate
from harness.ops import get_op
from harness.core.policy import default_policy
from kernels_tpu.mxu import F32_DOT_PRECISION, PASSES

SMOKE = get_suite("smoke")


@pytest.mark.heavy  # about 7 minutes of a core: `pytest -m heavy`, which .ci/run runs after the README's command
@pytest.mark.needs_leg("ref", "gpu", "tpu")  # every leg end to end; a TPU-side install has no GPU leg
def test_smoke_suite_end_to_end(tmp_path):
    code = main(["all", "--suite", "smoke", "--out", str(tmp_path), "--no-progress"])
    frames = {leg: pd.read_csv(tmp_path / f"{leg}.csv") for leg in ("ref", "gpu", "tpu")}
    run = code, tmp_path, frames
    failures = []
    for check in (check_every_leg_wrote_every_case_and_tensor, check_rows_name_their_mode_and_share_inputs,
                  check_no_error_nan_or_bound_violation, check_unsupported_and_not_provided_are_reasoned_rows,
                  check_causality_holds_on_every_leg, check_gate_verdicts,
                  check_tpu_rows_were_compiled_and_carry_their_mxu_cost):
        try:
            check(run)
        except AssertionError as exc:
            failures.append(f"{check.__name__}: {exc}")
    assert not failures, "\n".join(failures)


def check_every_leg_wrote_every_case_and_tensor(run):
    _, out, frames = run
    expected = {(c.id, t) for c in SMOKE for t in get_op(c.op).tensor_names(c)}
    for leg, df in frames.items():
        assert set(zip(df["case_id"], df["tensor"])) == expected, leg
    assert all((out / f"parity.{ext}").exists() for ext in ("csv", "md", "html", "png"))
    for leg in ("ref", "gpu", "tpu"):
        assert (out / f"causality-{leg}.csv").exists()


def check_rows_name_their_mode_and_share_inputs(run):
    _, _, frames = run
    assert set(frames["ref"]["mode"]) == {"native"}
    assert set(frames["gpu"]["mode"]) == {"emulated"} and set(frames["tpu"]["mode"]) == {"emulated"}
    hashes = [df.groupby("case_id")["input_sha256"].first() for df in frames.values()]
    for h in hashes[1:]:
        pd.testing.assert_series_equal(h, hashes[0])
    versions = json.loads(frames["gpu"]["versions"].iloc[0])
    assert {"triton", "fla-core", "torch"} <= set(versions)
    assert {"jax", "jaxlib"} <= set(json.loads(frames["tpu"]["versions"].iloc[0]))


def check_no_error_nan_or_bound_violation(run):
    _, _, frames = run
    for leg, df in frames.items():
        bad = df[df["status"].isin(("error", "nonfinite", "bound"))]
        assert bad.empty, f"{leg}: {bad[['case_id', 'tensor', 'status', 'reason']].to_dict('records')}"
        assert (df.loc[df["status"] == "ok", "nan"] == 0).all()


def check_unsupported_and_not_provided_are_reasoned_rows(run):
    _, _, frames = run
    tpu = frames["tpu"]
    refused = tpu[tpu["status"] == "unsupported"]
    assert all(isinstance(r, str) and r for r in refused["reason"])  # every refusal (if any) says why
    gpu = frames["gpu"]
    assert set(gpu.loc[gpu["status"] == "not_provided", "tensor"]) <= {"dg_gamma"}
    assert (gpu["tensor"] == "dg_gamma").any()


def check_causality_holds_on_every_leg(run):
    _, out, _ = run
    for leg in ("ref", "gpu", "tpu"):
        df = pd.read_csv(out / f"causality-{leg}.csv")
        assert set(df["status"]) == {"ok"}, df[df["status"] != "ok"].to_dict("records")


def check_gate_verdicts(run):
    code, out, frames = run
    parity = pd.read_csv(out / "parity.csv")
    assert {"pass", "info"} <= set(parity["verdict"])
    # `parity all` judged with the shipped, calibrated policy, and the clean kernels pass it
    shipped = apply_gate(frames["gpu"], frames["tpu"], default_policy())
    assert shipped.passed, shipped.failures[["case_id", "tensor", "metric", "ratio", "reason"]].to_dict("records")
    assert code == 0
    assert "policy: the shipped harness/policy.toml" in (out / "parity.md").read_text()



def _differentiable(case_id: str) -> list[str]:
    case = Case.from_id(case_id)
    return get_op(case.op).differentiable(case)


def check_tpu_rows_were_compiled_and_carry_their_mxu_cost(run):
    _, out, frames = run
    tpu = frames["tpu"]
    ran = tpu[tpu["status"] == "ok"]
    assert set(ran["compiled_for"]) == {"v6e"}, set(ran["compiled_for"])
    assert "compiled with libtpu" in (out / "parity.md").read_text()
    assert set(ran["mxu_check"]) == {"verified"}, set(ran["mxu_check"])  # every dot's passes as Mosaic emits them
    # the decode variants and decode chains compare no gradient: no backward, so no backward work
    forward_only = ran["case_id"].map(lambda cid: not _differentiable(cid))
    # the decode variants run the fused-recurrent kernels (kernels_tpu.kda.recurrent, forward only, and
    # kernels_tpu.gated_recurrent, simple_gla's and gla's, forward and backward), which have no dot: no MXU work, and
    # no cost ratio (NaN: 0 passes over 0 MACs); every other row's dots cost one pass or more per MAC
    no_dots = ran["mxu_macs_fwd"] == 0
    variant = ran["case_id"].str.split("/").str[0].str.split(".").str[1]
    assert no_dots.any() and set(variant[no_dots]) == {"fused_recurrent"}
    assert (forward_only[no_dots] | ran.loc[no_dots, "op"].isin(["simple_gla", "gla"])).all()
    assert ran.loc[no_dots, "mxu_cost"].isna().all() and (ran.loc[no_dots, "mxu_macs_bwd"] == 0).all()
    assert (ran.loc[~no_dots, "mxu_cost"] >= 1).all() and (ran.loc[~no_dots, "mxu_macs_fwd"] > 0).all()
    assert (ran.loc[~forward_only & ~no_dots, "mxu_macs_bwd"] > 0).all()
    assert (ran.loc[forward_only, "mxu_macs_bwd"] == 0).all()
    assert forward_only.any()
    cost = ran.groupby(["op", "dtype"])["mxu_cost"].max()
    # bf16 x bf16 dots are one pass; kda's kernels have only f32-operand dots, each at the policy's precision
    assert cost[("simple_gla", "bfloat16")] < cost[("simple_gla", "float32")]
    assert cost[("kda", "float32")] == PASSES[F32_DOT_PRECISION["float32"]]
