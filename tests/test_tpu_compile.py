"""The real TPU compiler in the loop: libtpu compiles every TPU case for v5e, v6e and v7x on this CPU,
and a kernel that interprets but does not compile fails the leg and the gate."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import pandas as pd
import pytest
from jax.experimental import pallas as pl

from cases.case import Case, Gate
from cases.suites import get_suite
from harness.cli import main
from harness.gate import apply_gate
from harness.reports import compiled_note
from harness.legs import make_leg
from harness.ops import get_op
from harness.policy import Policy
from harness.reference_cache import ReferenceCache
from harness.results import rows_to_frame
from harness.runner import Runner
from harness.compile_cases import case_rows
from harness.tpu_compile import (COMPILE_DEFAULT_TARGETS, ERROR_CHARS, TARGETS, CompileResult, compile_for,
                                 first_error_line, libtpu_version, parse_targets)


# ------------------------------------------------------------------ definitions
def test_parse_targets():
    assert parse_targets(None, ("v6e",)) == ("v6e",)
    assert parse_targets("v5e, v7x,v5e", ("v6e",)) == ("v5e", "v7x")
    with pytest.raises(ValueError, match="unknown TPU target.*v9"):
        parse_targets("v6e,v9", ("v6e",))
    assert set(COMPILE_DEFAULT_TARGETS) == {"v5e", "v6e", "v7x"} <= set(TARGETS)


def test_first_error_line_is_one_line_up_to_500_characters():
    exc = RuntimeError("INTERNAL: Mosaic failed to compile TPU kernel: x\n  %0 = tpu.reshape ...\n")
    assert first_error_line(exc) == "RuntimeError: INTERNAL: Mosaic failed to compile TPU kernel: x"
    long = first_error_line(ValueError("y" * 2000))
    assert len(long) == ERROR_CHARS and long.startswith("ValueError: yyy")


def test_hbm_bytes_is_arguments_outputs_temporaries_minus_aliases():
    mem = {"mem_argument_bytes": 1000, "mem_output_bytes": 300, "mem_temp_bytes": 20, "mem_alias_bytes": 100,
           "mem_code_bytes": 7}
    assert CompileResult("v6e", "ok", 0.1, memory=mem).hbm_bytes == 1220
    assert CompileResult("v6e", "error", 0.1, error="x").hbm_bytes is None


# ------------------------------------------------------------ the real compiler
def _fp16_load_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...].astype(jnp.float32)


def _fp16_roundtrip(x, interpret):
    """A Pallas kernel that loads fp16: it interprets, and Mosaic refuses it ("Invalid vector type for load")."""
    return pl.pallas_call(_fp16_load_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, jnp.float32),
                          interpret=interpret or False)(x.astype(jnp.float16))


def test_the_compiler_refuses_what_interpret_mode_runs():
    x = jnp.ones((16, 128), jnp.float32)
    assert float(_fp16_roundtrip(x, True).sum()) == 16 * 128  # interpret mode: fine
    result = compile_for(lambda a: _fp16_roundtrip(a, None), (x,), "v6e")
    assert result.status == "error" and "Mosaic failed to compile" in result.error, result
    ok = compile_for(lambda a: a * 2, (x,), "v5e")
    assert ok.ok and ok.memory["mem_argument_bytes"] == 16 * 128 * 4 and ok.hbm_bytes > 0


# regressions' 40-odd cases x 3 targets take about 5 minutes here: behind `slow`, and .ci/run compiles them
# with `parity compile --suite regressions --target v5e,v6e,v7x`, which fails on any error row
@pytest.mark.parametrize("suite", ["smoke", pytest.param("regressions", marks=pytest.mark.slow)])
def test_every_case_compiles_for_v5e_v6e_v7x(suite):
    rows = pd.DataFrame([r for case in get_suite(suite) for r in case_rows(case, COMPILE_DEFAULT_TARGETS)])
    bad = rows[rows["status"] == "error"]
    assert bad.empty, bad[["case_id", "target", "reason"]].to_dict("records")
    refused = rows[rows["status"] == "unsupported"]
    assert refused["reason"].str.len().gt(0).all()
    ok = rows[rows["status"] == "ok"]
    assert len(ok) >= 3 * 10 and (ok["compile_s"] > 0).all() and (ok["hbm_bytes"] > 0).all()
    assert set(ok["libtpu"]) != {"not installed"}


def test_compile_verb_writes_compile_csv_and_fails_on_an_error(tmp_path, monkeypatch, capsys):
    case = get_suite("smoke")[0]
    assert main(["compile", "--case", case.id, "--target", "v5e,v7x", "--out", str(tmp_path),
                 "--no-progress"]) == 0
    df = pd.read_csv(tmp_path / "compile.csv")
    assert list(df["target"]) == ["v5e", "v7x"] and set(df["status"]) == {"ok"} and set(df["mode"]) == {"aot"}
    assert {"compile_s", "error", "mem_temp_bytes", "hbm_bytes", "jax", "jaxlib", "libtpu"} <= set(df.columns)
    assert main(["compile", "--case", case.id, "--target", "v9", "--out", str(tmp_path)]) == 2

    import harness.compile_cases as tc  # parity compile calls compile_for from here

    def refuse(fn, args, target):
        return CompileResult(target, "error", 0.01, error="MosaicError: INTERNAL: Mosaic failed to compile")

    monkeypatch.setattr(tc, "compile_for", refuse)
    assert main(["compile", "--case", case.id, "--target", "v6e", "--out", str(tmp_path), "--no-progress"]) == 1
    row = pd.read_csv(tmp_path / "compile.csv").iloc[0]
    assert row["status"] == "error" and row["reason"].startswith("does not compile for TPU v6e: MosaicError")
    assert "ERROR" in capsys.readouterr().out


# ------------------------------------------------- the emulated leg compiles
CASE = Case("simple_gla", "chunk", B=1, T=64, H=1, K=128, V=128, dtype="bfloat16", gate=Gate(), chunk_size=64)


def test_a_kernel_that_does_not_compile_is_an_error_row_and_fails_the_gate():
    """A test-side binding: the real kernels, then an identity through a kernel that loads fp16."""
    op = get_op("simple_gla")

    @functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
    def touch(o, interpret):
        flat = o.reshape(-1, o.shape[-1]).astype(jnp.float32)
        return o + 0 * _fp16_roundtrip(flat, interpret).reshape(o.shape).astype(o.dtype)

    touch.defvjp(lambda o, interpret: (touch(o, interpret), None), lambda interpret, _, g: (g,))

    def forward(case, a, ctx):
        out = op.pallas.forward(case, a, ctx)
        return {**out, "o": touch(out["o"], ctx.interpret)}

    faulty = {"simple_gla": dataclasses.replace(op, pallas=dataclasses.replace(op.pallas, forward=forward))}
    cache = ReferenceCache(None)
    good = Runner(make_leg("tpu"), cache).run_case(CASE)
    assert {r["status"] for r in good} == {"ok"} and {r["compiled_for"] for r in good} == {"v6e"}
    bad = Runner(make_leg("tpu"), cache, ops=faulty).run_case(CASE)
    assert {r["status"] for r in bad} == {"error"}
    # jax 0.10 raises a MosaicError; jax 0.12 a JaxRuntimeError whose text names Mosaic. Both are this refusal.
    refused = [r["reason"].startswith("does not compile for TPU v6e:") and "Mosaic" in r["reason"] for r in bad]
    assert all(refused), bad[0]["reason"]
    result = apply_gate(rows_to_frame(good), rows_to_frame(bad), Policy(), baseline_leg="tpu")
    assert not result.passed and set(result.failures["tensor"]) == set(op.tensor_names(CASE))


def test_parity_md_names_the_compile_targets():
    frame = rows_to_frame(Runner(make_leg("tpu", compile_targets=("v5e", "v7x")), ReferenceCache(None)).run_case(CASE))
    assert set(frame["compiled_for"]) == {"v5e,v7x"}
    note = compiled_note(frame)
    assert f"libtpu {libtpu_version()} for v5e, v7x" in note
    assert "not** compiled" in compiled_note(frame.assign(compiled_for=pd.NA))
