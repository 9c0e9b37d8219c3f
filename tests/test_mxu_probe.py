"""parity mxu-probe (harness/probes/mxu_probe.py): the bit-level hypotheses on hand-computed values, the probe set's
power to tell every hypothesis apart, and the dry run end to end (interpret mode with the MXU model), with a
fault in the model that the probe must name."""

import contextlib
import csv

import ml_dtypes
import numpy as np
import pytest

from harness.probes import mxu_probe as mp


def f32(*bits):
    return mp.from_bits(np.array(bits, dtype=np.uint32))


def bits_of(x):
    return [int(b) for b in mp.f32_bits(x)]


# ------------------------------------------------------------------------------- bit helpers, by hand
@pytest.mark.parametrize("x, nearest, truncated", [
    (0x3F80C000, 0x3F810000, 0x3F800000),  # 1 + 0.75 bf16 ulp: nearest goes up, truncation down
    (0x3F804000, 0x3F800000, 0x3F800000),  # below half: both down
    (0x3F808000, 0x3F800000, 0x3F800000),  # a tie, kept bit even: nearest-even stays
    (0x3F818000, 0x3F820000, 0x3F810000),  # a tie, kept bit odd: nearest-even goes up
    (0xBF80C000, 0xBF810000, 0xBF800000),  # negative: truncation is towards zero
    (0x3FFFFFFF, 0x40000000, 0x3FFF0000),  # all ones: rounding carries into the exponent
])
def test_bf16_roundings_by_hand(x, nearest, truncated):
    assert bits_of(mp.bf16_nearest_even(f32(x))) == [nearest]
    assert bits_of(mp.bf16_truncate(f32(x))) == [truncated]


def test_nearest_even_is_ml_dtypes_rounding_on_every_probe_value():
    values = np.concatenate([mp.f32_probe_values(), mp.random_values("f32", 4000, 7)])
    assert bits_of(mp.bf16_nearest_even(values)) == bits_of(values.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_splits_by_hand():
    x = f32(0x3F80C0C0)  # 1 + 0xC0C0 * 2^-23: bits in both dropped bytes, each above half
    hi, mid, lo = mp.split_bf16(x, 3, "trunc")
    assert (hi[0], mid[0], lo[0]) == (1.0, 0xC000 * 2.0**-23, 0xC0 * 2.0**-23)
    hi, mid = mp.split_bf16(x, 2, "rne")  # hi rounds up; the residual -0x3F40 * 2^-23 has 7 bits: exact
    assert (hi[0], mid[0]) == (1.0078125, -0x3F40 * 2.0**-23)
    hi, mid = mp.split_bf16(f32(0x3F8080C0), 2, "rne")  # residual -0x7F40 * 2^-23: a tie at 8 bits, kept even
    assert (hi[0], mid[0]) == (1.0078125, -0x7F00 * 2.0**-23)
    assert sum(mp.split_bf16(x, 3, "rne"))[0] == float(x[0]) == sum(mp.split_bf16(x, 3, "trunc"))[0]


def test_ulp_distance_across_zero_and_sign():
    assert mp.ulp_distance([0x3F800001], [0x3F800000]).tolist() == [1]
    assert mp.ulp_distance([0x80000001], [0x00000001]).tolist() == [2]  # -min subnormal to +min subnormal
    assert mp.ulp_distance([0x80000000], [0x00000000]).tolist() == [0]  # -0 and +0: same value, different bits


# ------------------------------------------------------------------------------- the classifier, by hand
def lhs_verdict(x_bits, got_bits, partner=1.0):
    x, y = f32(*x_bits), np.full(len(x_bits), partner, np.float32)
    return mp.classify(x, y, np.array(got_bits, np.uint32), mp.operand_hypotheses("lhs", "f32"))


def test_classifier_tells_nearest_even_from_truncation():
    assert lhs_verdict([0x3F80C000], [0x3F810000]).matching == ("bf16-rne",)
    assert lhs_verdict([0x3F80C000], [0x3F800000]).matching == ("bf16-trunc",)
    assert lhs_verdict([0x3F80C000], [0x3F80C000]).matching == ("exact", "2pc-trunc", "2pc-rne")  # no low byte
    # x -0.5: the product is exact, so the operand still reads through
    assert lhs_verdict([0x3F80C000], [0xBF010000], partner=-0.5).matching == ("bf16-rne",)


def test_a_tie_alone_cannot_decide_and_a_tie_with_an_odd_kept_bit_can():
    assert lhs_verdict([0x3F808000], [0x3F800000]).text == "bf16-rne = bf16-trunc"
    assert lhs_verdict([0x3F808000, 0x3F818000], [0x3F800000, 0x3F820000]).matching == ("bf16-rne",)


def test_two_pieces_by_truncation_or_by_rounding():
    # 1 + 0x80C0 * 2^-23. By truncation: 1 + 0x8000 * 2^-23. By rounding: hi 1 + 2^-7, residual -0x7F40 * 2^-23
    # rounds (a tie, kept bits even) to -0x7F00 * 2^-23: 1 + 0x8100 * 2^-23.
    x = 0x3F8080C0
    assert lhs_verdict([x], [0x3F808000]).matching == ("2pc-trunc",)
    assert lhs_verdict([x], [0x3F808100]).matching == ("2pc-rne",)
    assert lhs_verdict([x], [0x3F810000]).matching == ("bf16-rne",)
    assert lhs_verdict([x], [0x3F8080C0]).matching == ("exact",)


def test_no_hypothesis_gives_none_with_the_closest_and_its_worst_mismatch():
    # a tie rounded away from zero (0x3F808000 -> 0x3F810000) is neither nearest-even nor truncation
    v = lhs_verdict([0x3F808000, 0x3F80C000], [0x3F810000, 0x3F810000])
    assert v.matching == () and not v.explained
    assert (v.closest, v.off, v.probes) == ("bf16-rne", 1, 2)  # one probe off, the fewest of all
    assert (v.worst_ulps, v.worst_probe) == (0x10000, 0)  # 0x3F810000 vs 0x3F800000: one bf16 ulp
    assert v.text == "none (closest bf16-rne: 1/2 probes off, worst 65536 ulp)"


def test_product_hypotheses_by_hand():
    x, y = f32(0x3F80C0C0), f32(0x3F80C0C0)  # 1 + e with e = 0xC0C0 * 2^-23
    by_id = {h.id: h for h in mp.product_hypotheses("f32")}
    e = 0xC0C0 * 2.0**-23
    assert by_id["exact"].predict(x, y).tolist() == bits_of(np.float32((1 + e) ** 2))  # exact in float64
    assert by_id["1pass-rne"].predict(x, y).tolist() == bits_of(np.float32(1.0078125 ** 2))  # 16 bits: exact
    assert by_id["1pass-trunc"].predict(x, y).tolist() == bits_of(np.float32(1.0))
    t = 0xC000 * 2.0**-23  # bf16x3 by truncation: hi = 1, lo = t; 1 + 2t, lo*lo dropped; exact in f32
    assert by_id["x3-trunc-small1st"].predict(x, y).tolist() == bits_of(np.float32(1 + 2 * t))
    assert by_id["x4-trunc-fused"].predict(x, y).tolist() == bits_of(np.float32((1 + t) ** 2))


EQUAL_ON_THE_PROBES = {frozenset({"x6-rne-large1st", "x9-rne-large1st"})}
"""Hypotheses no probe tells apart: with nearest-even pieces, the three products bf16x9 adds to bf16x6 (each at
most about 2^-25 |xy|) did not change the f32 sum they are added to last on any probe, nor on 200000 seeded
random pairs."""


@pytest.mark.parametrize("kind", ["f32", "bf16"])
@pytest.mark.parametrize("probe", mp.PROBES)
def test_the_probes_tell_every_hypothesis_from_every_other(kind, probe):
    """Taken as the truth, each hypothesis is the verdict, alone (but for EQUAL_ON_THE_PROBES)."""
    x, y = mp.layout(kind).operands(probe)
    candidates = mp.hypotheses(probe, kind)
    assert len(candidates) >= 2
    for truth in candidates:
        matching = mp.classify(x, y, truth.predict(x, y), candidates).matching
        assert truth.id in matching
        assert len(matching) == 1 or frozenset(matching) in EQUAL_ON_THE_PROBES, (truth.id, matching)


def test_the_layout_puts_one_product_on_each_output():
    lay = mp.layout("f32")
    a, b = lay.arrays(np.float32)
    out = np.einsum("gmk,gkn->gmn", a.astype(np.float64), b.astype(np.float64))  # exact: one term each
    for probe in mp.PROBES:
        x, y = lay.operands(probe)
        assert lay.outputs(out, probe).tolist() == mp.f32_bits((x.astype(np.float64) * y).astype(np.float32)).tolist()


# ------------------------------------------------------------------------------- the dry run, end to end
def run(tmp_path, *argv):
    from harness.cli import main

    return main(["mxu-probe", "--out", str(tmp_path), *argv])


def verdicts(path):
    out = {}
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            out.setdefault((row["precision"], row["operand"]), set()).add(row["verdict"])
    return {k: v.pop() for k, v in out.items() if len(v) == 1}


def test_dry_run_reads_the_models_rounding(tmp_path, capsys):
    import jax

    assert run(tmp_path) == mp.EXIT_PASS
    printed = capsys.readouterr().out
    assert mp.DRY_RUN_NOTE in printed
    v = verdicts(tmp_path / mp.CSV_NAME)
    assert v["DEFAULT", "lhs"] == v["DEFAULT", "rhs"] == "bf16-rne"
    assert v["DEFAULT", "product"] == "1pass-rne"
    assert v["bf16", "lhs"] == v["bf16", "rhs"] == v["bf16", "product"] == "exact"
    assert v["HIGHEST", "lhs"] == v["HIGHEST", "rhs"] == "exact"  # 3 pieces of 8 bits hold an f32 value
    if jax.__version__.startswith(("0.9.", "0.10.")):  # Pallas TPU lowering refuses HIGH: not run
        assert v["HIGH", ""].startswith(f"refused by jax {jax.__version__}'s Pallas TPU lowering:")
        assert "Unsupported dot precision" in v["HIGH", ""]
    else:
        assert ("HIGH", "lhs") in v
    with open(tmp_path / mp.CSV_NAME, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert all(r["mode"] == "dry run" for r in rows)
    explained = [r for r in rows if r["operand"]]
    assert explained and all(r["out_bits"] == r["expected_bits"] and r["ulp_off"] == "0" for r in explained)


def test_without_the_model_the_dry_run_reads_exact_f32(tmp_path):
    """XLA:CPU computes an f32 dot exactly: with the model switched off DEFAULT would read as exact, which is
    why the dry run runs inside it."""
    result = mp.probe_precision("DEFAULT", native=False, target=None, model=contextlib.nullcontext)
    assert result.verdicts["lhs"].matching == ("exact",)
    assert result.verdicts["product"].matching == ("exact",)


def test_a_fault_in_the_models_rounding_is_named(tmp_path, capsys, monkeypatch):
    """A test-side fault: the model truncates DEFAULT's f32 lhs instead of rounding it. The probe says so, finds
    the rhs still nearest-even, and no product hypothesis (each rounds both operands alike): exit 1."""
    import jax.numpy as jnp
    from jax import lax

    from kernels_tpu import mxu

    original = mxu.modeled_dot

    def truncating_lhs(a, b, passes, dims, **kwargs):
        if len(passes) == 1 and a.dtype == jnp.float32:
            a = lax.bitcast_convert_type(lax.bitcast_convert_type(a, jnp.uint32) & jnp.uint32(0xFFFF0000),
                                         jnp.float32)
        return original(a, b, passes, dims, **kwargs)

    monkeypatch.setattr(mxu, "modeled_dot", truncating_lhs)
    assert run(tmp_path, "--precision", "DEFAULT") == mp.EXIT_UNEXPLAINED
    v = verdicts(tmp_path / mp.CSV_NAME)
    assert (v["DEFAULT", "lhs"], v["DEFAULT", "rhs"]) == ("bf16-trunc", "bf16-rne")
    assert v["DEFAULT", "product"].startswith("none (closest ")
    assert "DEFAULT product: worst mismatch 0x" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--precision", "DEFAULT,LOW"], "unknown precision(s) ['LOW']"),
    (["--target", "v9"], "unknown TPU target 'v9'"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    assert run(tmp_path, *argv) == mp.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and err.startswith("parity mxu-probe: error: ")


def test_an_out_that_is_a_file_is_exit_2(tmp_path, capsys):
    path = tmp_path / "file"
    path.write_text("")
    assert run(path) == mp.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a file, not a directory" in err
