"""The real TPU compiler in the loop: libtpu compiles every TPU case for v5e, v6e and v7x on this CPU,
a kernel that interprets but does not compile fails the leg and the gate, and no interpreter passes the
compile: every kernel must reach Mosaic as its library built it (issue 41)."""

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
from harness.judge.gate import apply_gate
from harness.report.reports import compiled_note
from harness.legs import make_leg
from harness.ops import get_op
from harness.core.policy import Policy
from harness.run.reference_cache import ReferenceCache
from harness.core.results import rows_to_frame
from harness.run.runner import Runner
from harness.probes.compile_cases import case_rows
from harness.compile.tpu_compile import (COMPILE_DEFAULT_TARGETS, ERROR_CHARS, TARGETS, CompileResult, Kernels, compile_for,
                                 first_error_line, libtpu_version, mosaic_kernels, parse_targets, traced_kernels)


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


# smoke's cases x 3 targets take about 100 s of a core here, regressions' about 5 minutes: behind `slow`, and
# .ci/run compiles both on every stack with `parity compile --target v5e,v6e,v7x`, which fails on any error row
# (a committed row standing for a compile only while its content key is unchanged: docs/ci.md)
@pytest.mark.slow
@pytest.mark.parametrize("suite", ["smoke", "regressions"])
def test_every_case_compiles_for_v5e_v6e_v7x(suite):
    runner = Runner(make_leg("tpu", compile_targets=()), ReferenceCache(None))
    rows = pd.DataFrame([r for case in get_suite(suite) for r in case_rows(case, COMPILE_DEFAULT_TARGETS, runner)])
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

    import harness.probes.compile_cases as tc  # parity compile calls compile_for from here

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
    assert "Mosaic emitted for every kernel dot: 1 of 1 case(s) verified." in note
    unread = compiled_note(frame.assign(mxu_check="unverified: no dump"))
    assert unread.endswith("0 of 1 case(s) verified. **1 not verified**: unverified: no dump.")


# ------------------------------------------------ every kernel reaches Mosaic
def test_kernels_are_matched_by_name():
    k = Kernels(traced=("a", "b", "a", "c", "d"), interpreted=("c",), mosaic=("a", "b", "c"))
    assert k.missing == ["d"]  # the second a shares the first's custom call (jax may lower equal kernels once)
    # traced 5; reached Mosaic as built: a, b, a (c was asked for interpret mode, then lowered natively)
    assert k.counts == {"kernels_traced": 5, "kernels_mosaic": 3}
    problem = k.problem()
    assert problem.startswith("Mosaic compiled 3 of 5 kernels as their library built them; ")
    assert "d did not reach Mosaic" in problem and "c asked by their library for interpret mode" in problem
    assert Kernels(("a", "a"), (), ("a", "a")).problem() == ""
    assert Kernels(("a", "a", "b"), (), ()).problem().startswith("Mosaic compiled 0 of 3")
    assert "a (x2), b did not reach" in Kernels(("a", "a", "b"), (), ()).problem()
    assert Kernels((), (), ()).counts == {"kernels_traced": 0, "kernels_mosaic": 0}  # no kernel: plain XLA


def test_mosaic_kernels_reads_the_custom_calls_of_a_lowered_module():
    text = ('%0 = stablehlo.custom_call @tpu_custom_call(%a) {backend_config = "x", kernel_name = "k1"} : f32\n'
            '%1 = stablehlo.custom_call @Sharding(%b) {kernel_name = "no"} : f32\n'
            '%2 = stablehlo.custom_call @tpu_custom_call(%c) {backend_config = "y"} : f32\n'
            '%3 = stablehlo.custom_call @tpu_custom_call(%d) {kernel_name = "k1"} : f32\n')
    assert mosaic_kernels(text) == ("k1", "unnamed kernel", "k1")


def _double(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2


def _kernel(x, interpret, name):
    return pl.pallas_call(_double, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=interpret,
                          name=name)(x)


def _two_kernels(interpret):
    """One kernel inside a jitted function, one outside."""
    inner = jax.jit(lambda b: _kernel(b, interpret, "inner"))
    return lambda a: _kernel(inner(a), interpret, "outer")


X = jnp.ones((16, 128), jnp.float32)


def test_an_unnamed_kernel_is_named_as_mosaic_names_it():
    """No ``name``: Mosaic's lowering names the custom call by the kernel body's function, sanitized."""
    unnamed = lambda x: pl.pallas_call(_double, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)  # noqa: E731
    body = lambda x_ref, o_ref: _double(x_ref, o_ref)  # noqa: E731
    lam = lambda x: pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)  # noqa: E731
    result = compile_for(lambda a: lam(unnamed(a)), (X,), "v6e")
    assert result.ok and sorted(result.kernels.traced) == sorted(result.kernels.mosaic) == ["_double", "_lambda_"]


def test_traced_kernels_counts_each_distinct_program_once():
    kernels = traced_kernels(jax.jit(_two_kernels(False)).trace(X).jaxpr)
    assert sorted(kernels.traced) == ["inner", "outer"] and kernels.interpreted == ()
    assert traced_kernels(jax.jit(_two_kernels(True)).trace(X).jaxpr).interpreted == ("inner", "outer")
    # a jitted function called twice on the same types is one program, lowered once: one kernel
    inner = jax.jit(lambda b: _kernel(b, False, "inner"))
    assert traced_kernels(jax.jit(lambda a: inner(a) + inner(a * 3)).trace(X).jaxpr).traced == ("inner",)


def test_native_kernels_compile_and_are_counted():
    result = compile_for(_two_kernels(False), (X,), "v6e")
    assert result.ok and result.kernel_counts == {"kernels_traced": 2, "kernels_mosaic": 2}, result
    inner = jax.jit(lambda b: _kernel(b, False, "inner"))
    twice = compile_for(lambda a: inner(inner(a)), (X,), "v6e")  # the second call's input has another sharding
    assert twice.ok and twice.kernels.traced == twice.kernels.mosaic == ("inner", "inner"), twice


@pytest.mark.parametrize("interpret", [True, "params"], ids=["interpret=True", "InterpretParams"])
def test_a_kernel_its_library_interprets_is_never_ok(interpret):
    """A library that picks interpret mode itself (tops: ``not is_tpu_runtime()``) hands interpret=True to
    pallas_call on this CPU. The compile lowers it natively all the same, but the row is an error naming it."""
    from jax.experimental.pallas import tpu as pltpu

    interpret = pltpu.InterpretParams() if interpret == "params" else interpret
    result = compile_for(_two_kernels(interpret), (X,), "v6e")
    assert result.status == "error" and result.kernel_counts == {"kernels_traced": 2, "kernels_mosaic": 0}
    assert result.reason.startswith("does not compile for TPU v6e: Mosaic compiled 0 of 2 kernels as their "
                                    "library built them; inner, outer asked by their library for interpret mode")
    one = compile_for(lambda a: _kernel(_kernel(a, False, "plain"), interpret, "interpreted"), (X,), "v6e")
    assert one.kernel_counts == {"kernels_traced": 2, "kernels_mosaic": 1}
    assert "; interpreted asked by their library" in one.reason and "plain" not in one.reason


def test_a_kernel_lowered_without_mosaic_is_an_error_naming_it(monkeypatch):
    """A TPU lowering of pallas_call replaced, from the test side, by Pallas's HLO interpreter: interpret=False
    at the kernel, yet no Mosaic custom call. XLA:TPU compiles the result; the compile must not say ok."""
    from jax._src.interpreters import mlir
    from jax._src.pallas import hlo_interpreter
    from jax._src.pallas.pallas_call import pallas_call_p

    def interpreted(ctx, *args, interpret, **params):
        del interpret
        return mlir.lower_fun(functools.partial(hlo_interpreter.pallas_call_hlo_interpret, **params),
                              multiple_results=True)(ctx, *args)

    monkeypatch.setitem(mlir._platform_specific_lowerings["tpu"], pallas_call_p, mlir.LoweringRuleEntry(
        interpreted, False))
    jax.clear_caches()
    result = compile_for(lambda a: _kernel(a, False, "replaced"), (X,), "v6e")
    jax.clear_caches()
    assert result.status == "error" and result.kernel_counts == {"kernels_traced": 1, "kernels_mosaic": 0}
    assert "replaced did not reach Mosaic" in result.reason


CANDIDATE = """
import functools

from harness.ops.base import LegBinding
from kernels_tpu.simple_gla import chunk_simple_gla


def forward(case, a, ctx, interpret=None):
    o, ht = chunk_simple_gla(a["q"], a["k"], a["v"], g=a.get("g"), scale=case.resolved_scale,
                             initial_state=a.get("h0"), output_final_state=case.final_state,
                             chunk_size=case.chunk_size, interpret=interpret)
    return {"o": o, "ht": ht}


class Impl:
    version = "library 1.0"

    def __init__(self, binding):
        self.bindings = {"simple_gla": binding}


NATIVE = Impl(LegBinding(forward))
HARD_CODED = Impl(LegBinding(functools.partial(forward, interpret=True)))  # interpret=True, whatever runs it
"""


@pytest.mark.heavy  # a whole run and compile of a candidate: pytest -m heavy (.ci/run)
def test_a_candidate_that_hard_codes_interpret_fails_compile_and_preflight(tmp_path, monkeypatch):
    from harness.legs import registry

    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_LEGS", {spec.name: spec for spec in registry.BUILTIN})
    (tmp_path / "library_under_test.py").write_text(CANDIDATE)
    case = "simple_gla.chunk/B1-T64-H1-K128-V128/bf16/g=logsigmoid/16/C64"
    for name, code in (("NATIVE", 0), ("HARD_CODED", 1)):
        out, leg = tmp_path / name, name.lower().replace("_", "-")
        impl = ["--backend", leg, "--impl", f"{leg}=library_under_test:{name}", "--case", case, "--out", str(out),
                "--no-progress"]
        assert main(["compile", *impl, "--target", "v5e,v7x"]) == code
        rows = pd.read_csv(out / f"compile.{leg}.csv")
        assert (rows["kernels_traced"] == 3).all()  # simple_gla's forward, its recompute, its backward
        assert main(["run", *impl, "--tpu-targets", "v6e"]) == code  # the emulated leg's preflight
        [run] = out.glob(f"{leg}.cases-*.csv")
        run = pd.read_csv(run)
        if code == 0:
            assert set(rows["status"]) == set(run["status"]) == {"ok"} and (rows["kernels_mosaic"] == 3).all()
            assert set(run["kernels_traced"]) == set(run["kernels_mosaic"]) == {3}
        else:
            assert set(rows["status"]) == set(run["status"]) == {"error"} and (rows["kernels_mosaic"] == 0).all()
            assert run["reason"].str.startswith("does not compile for TPU v6e: Mosaic compiled 0 of 3").all()
            assert rows["reason"].str.contains("simple_gla_fwd (x2), chunk_simple_gla_bwd asked by their", regex=False).all()


# ------------------------------------------------- a committed compile reused by content (parity compile --reuse)
def _compile_keys(edited: str | None, monkeypatch) -> dict[str, str]:
    """Each op's content key of its smallest smoke case on v6e, after a one-line edit of ``edited``."""
    import pathlib

    from harness.probes.compile_cases import ContentKeys

    if edited is not None:
        target, real = (pathlib.Path(__file__).resolve().parents[1] / edited).resolve(), pathlib.Path.read_bytes
        monkeypatch.setattr(pathlib.Path, "read_bytes",
                            lambda self: real(self) + (b"\n# edited\n" if self.resolve() == target else b""))
    keys = ContentKeys(make_leg("tpu", compile_targets=()))
    cases = {c.op: c for c in sorted(get_suite("smoke"), key=lambda c: -c.B * c.T * c.H)}
    return {op: keys(get_op(op), case, "v6e") for op, case in cases.items()}


@pytest.mark.parametrize("edited, moved", [
    # gdn2's kernels import kda's pieces (its option checks and layout), and all three the shared delta-rule core;
    # kernels_tpu.gated_recurrent (simple_gla's and gla's decode) shares only the call's config with them
    ("kernels_tpu/kda/chunk.py", {"kda", "gdn", "gdn2"}),
    ("kernels_tpu/delta_rule.py", {"kda", "gdn", "gdn2"}),
    ("kernels_tpu/call_config.py", {"simple_gla", "gla", "kda", "gdn", "gdn2"}),
    ("kernels_tpu/gated_recurrent.py", {"simple_gla", "gla"}),
    ("kernels_tpu/gdn2/chunk.py", {"gdn2"}),
    ("kernels_tpu/gla/fused.py", {"gla"}),
    ("kernels_tpu/mxu.py", {"simple_gla", "gla", "kda", "gdn", "gdn2"}),  # the MXU model: every dot's passes
    ("harness/compile/mosaic_dump.py", {"simple_gla", "gla", "kda", "gdn", "gdn2"}),  # how Mosaic's passes are read
    ("harness/probes/compile_cases.py", {"simple_gla", "gla", "kda", "gdn", "gdn2"}),
    ("harness/run/runner.py", {"simple_gla", "gla", "kda", "gdn", "gdn2"}),  # validation, inputs, supports
    ("harness/judge/gate.py", set()),  # judging: no compile row depends on it
])
def test_a_compile_rows_content_key_moves_with_exactly_what_the_row_was_made_from(monkeypatch, edited, moved):
    before = _compile_keys(None, monkeypatch)
    assert None not in before.values() and len(set(before.values())) == len(before)
    after = _compile_keys(edited, monkeypatch)
    assert {op for op in before if after[op] != before[op]} == moved


def test_a_compile_rows_content_key_names_its_target_and_libtpu(monkeypatch):
    from harness.probes.compile_cases import ContentKeys

    import harness.legs.tpu as tpu_leg

    case = get_suite("smoke")[0]
    keys = ContentKeys(make_leg("tpu", compile_targets=()))
    assert keys(get_op(case.op), case, "v5e") != keys(get_op(case.op), case, "v6e")
    real = tpu_leg.TpuLeg.environment

    def newer_libtpu(self):
        env = real(self)
        return dataclasses.replace(env, versions={**env.versions, "libtpu": "99.0"})

    monkeypatch.setattr(tpu_leg.TpuLeg, "environment", newer_libtpu)
    assert ContentKeys(make_leg("tpu", compile_targets=()))(get_op(case.op), case, "v6e") != \
        keys(get_op(case.op), case, "v6e")


def test_compile_reuse_serves_rows_whose_key_is_unchanged_and_compiles_the_rest(tmp_path, monkeypatch, capsys):
    import harness.probes.compile_cases as tc

    case = min(get_suite("smoke"), key=lambda c: (c.B * c.T * c.H * (c.K + c.V), c.id))
    first = tmp_path / "first"
    assert main(["compile", "--case", case.id, "--target", "v6e", "--out", str(first), "--no-progress"]) == 0
    made = pd.read_csv(first / "compile.csv")
    assert made["content_key"].str.fullmatch("[0-9a-f]{64}").all() and made["reused_from"].isna().all()

    def no_compile(fn, args, target):
        raise AssertionError("a reused case must not compile")

    monkeypatch.setattr(tc, "compile_for", no_compile)
    again = tmp_path / "again"
    assert main(["compile", "--case", case.id, "--target", "v6e", "--out", str(again), "--no-progress",
                 "--reuse", str(first / "compile.csv")]) == 0
    assert "1 of 1 cases reused" in capsys.readouterr().out
    served = pd.read_csv(again / "compile.csv")
    assert list(served["reused_from"]) == [str(first / "compile.csv")]
    same = ["content_key", "status", "mxu_check", "kernels_mosaic", "hbm_bytes", "git_commit", "timestamp"]
    pd.testing.assert_frame_equal(served[same], made[same])

    # a target the record lacks compiles (all of the case's targets then compile: refused here, so exit 1)
    def refuse(fn, args, target):
        return CompileResult(target, "error", 0.01, error="MosaicError: refused")

    monkeypatch.setattr(tc, "compile_for", refuse)
    assert main(["compile", "--case", case.id, "--target", "v5e,v6e", "--out", str(tmp_path / "more"),
                 "--no-progress", "--reuse", str(first / "compile.csv")]) == 1
    # a row whose key differs (made from other sources) compiles, and an error row is never reused
    stale = made.assign(content_key="0" * 64)
    stale.to_csv(tmp_path / "stale.csv.gz", index=False)
    assert main(["compile", "--case", case.id, "--target", "v6e", "--out", str(tmp_path / "stale"),
                 "--no-progress", "--reuse", str(tmp_path / "stale.csv.gz")]) == 1
    errors = pd.read_csv(tmp_path / "stale" / "compile.csv")
    errors.to_csv(tmp_path / "errors.csv", index=False)
    assert main(["compile", "--case", case.id, "--target", "v6e", "--out", str(tmp_path / "errors"),
                 "--no-progress", "--reuse", str(tmp_path / "errors.csv")]) == 1


def test_compile_reuse_of_a_missing_or_keyless_file_is_a_usage_error(tmp_path, capsys):
    case = get_suite("smoke")[0]
    base = ["compile", "--case", case.id, "--target", "v6e", "--out", str(tmp_path), "--no-progress"]
    assert main([*base, "--reuse", str(tmp_path / "absent.csv")]) == 2
    assert "no such file" in capsys.readouterr().err
    pd.DataFrame({"case_id": [case.id], "target": ["v6e"], "status": ["ok"]}).to_csv(tmp_path / "old.csv")
    assert main([*base, "--reuse", str(tmp_path / "old.csv")]) == 2
    assert "no content_key" in capsys.readouterr().err
