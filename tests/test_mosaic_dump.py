"""The compile reads the MXU passes Mosaic emitted for every dot of every kernel and checks them against the
MXU model: the LLO reader and the matching on hand-made dumps, then real compiles (libtpu, deviceless) with
faults injected from the test side: a model that claims other passes, and a lowering that changes one dot's
precision without telling the model."""

import functools
import os

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.experimental import pallas as pl

from harness.compile import mosaic_dump, tpu_compile
from harness.compile.mosaic_dump import MISMATCH, UNVERIFIED, VERIFIED, Dot, DumpDir, DumpError, llo_phases, mismatch
from harness.compile.tpu_compile import compile_for
from harness.compile.tpu_env import MOSAIC_DUMP_OWNER, dump_mosaic_passes
from kernels_tpu import mxu
from kernels_tpu.mxu import BF16, HI8, LO8, MID8, NEAREST

# ------------------------------------------------------------------------------- reading the LLO
LATCH = '    "llo.vlatch{i}"(%1) <{{gain_latch_mode = #llo.gain_latch_mode<{mode}>, mxu_id = 0 : i32}}> : ...\n'
MUL = ('    "llo.vmatmul{m}"(%2) <{{data_format = #llo.matmul_data_format<{fmt}>, dwg = false, '
       'mode = #llo.matmul_mode<{mode}>, mxu_id = 0 : i32}}> : ...\n')
DWG = '    "llo.vdwg"() <{mxu_id = 0 : i32}> : () -> ()\n'


def phase(latch, mode, fmt="f32", v5e=False):
    """One weight phase as Mosaic writes it: two latches, two row pushes, done-with-gains."""
    i, m = ("", "") if v5e else ("i", ".mubr")
    return 2 * LATCH.format(i=i, mode=latch) + 2 * MUL.format(m=m, fmt=fmt, mode=mode) + DWG


def llo(*phases, name="kernel_a"):
    return f"module {{\n  func.func @{name}(%arg0: memref<8x128xf32>) {{\n{''.join(phases)}  }}\n}}\n"


def test_llo_phases_read_each_operand_piece():
    text = llo(phase("packed.bf16", "round", "bf16"), phase("f32", "round"), phase("xpose.f32", "round"),
               phase("hi.f32", "soft_low_eight"), phase("soft_low_eight.f32", "high"), phase("low.f32", "low"),
               phase("hi.f32", "soft_middle_eight"), phase("soft_middle_eight.f32", "high"),
               phase("hi.f32", "high", v5e=True))
    name, phases = llo_phases(text)
    assert name == "kernel_a"
    assert phases == [(BF16, BF16), (NEAREST, NEAREST), (NEAREST, NEAREST), (LO8, HI8), (HI8, LO8), (MID8, MID8),
                      (MID8, HI8), (HI8, MID8), (HI8, HI8)]


def test_the_kernel_of_a_dump_by_libtpu_version():
    assert mosaic_dump.dumped_kernel_name("7-0015-mosaic-dump-anonymous-post-lower-to-llo.txt", "k") == "k"  # 0.0.42
    assert mosaic_dump.dumped_kernel_name("7-0013-mosaic-dump-k_2-post-lower-to-llo.txt", "main") == "k_2"  # 0.0.37


def test_llo_phases_refuse_what_they_do_not_know():
    with pytest.raises(DumpError, match="unknown MXU operand mode 'int8_magic'"):
        llo_phases(llo(phase("f32", "int8_magic")))
    with pytest.raises(DumpError, match="mixes operand pieces"):
        llo_phases(llo(LATCH.format(i="i", mode="hi.f32") + LATCH.format(i="i", mode="low.f32")
                       + MUL.format(m=".mubr", fmt="f32", mode="high") + DWG))
    generic = '"builtin.module"() ({\n  "func.func"() <{arg_attrs = [], sym_name = "k_generic"}> ({\n'
    assert llo_phases(generic + phase("f32", "round")) == ("k_generic", [(NEAREST, NEAREST)])
    quoted = llo(phase("f32", "round"), name='"decoding_gdn-bt_8"')  # tpu-inference's kernel names
    assert llo_phases(quoted) == ("decoding_gdn-bt_8", [(NEAREST, NEAREST)])
    with pytest.raises(DumpError, match="no func.func"):
        llo_phases("module {}")


# ------------------------------------------------------------------------------- matching dots to phases
HIGHEST = mxu.mxu_passes(lax.Precision.HIGHEST, jnp.float32, jnp.float32)
ONE = ((NEAREST, NEAREST),)
BF = ((BF16, BF16),)


def dots(*passes):
    return [Dot(i + 1, f"dot{i + 1}", p) for i, p in enumerate(passes)]


def test_phases_read_as_the_dots_passes_tiles_included():
    # dot 1: bf16 over 3 tiles; dots 2 and 3 DEFAULT f32 (their tiles cannot be told apart: 1 + 2); dot 4 HIGHEST
    # over 2 tiles; dot 5 bf16 again
    phases = [BF[0]] * 3 + [ONE[0]] * 3 + list(HIGHEST) * 2 + [BF[0]]
    assert mismatch("k", dots(BF, ONE, ONE, HIGHEST, BF), phases) == ""


def test_a_dot_with_other_passes_is_named_with_both_counts():
    phases = [BF[0]] + list(HIGHEST) + [BF[0]]  # Mosaic ran dot 2 at 6 passes
    msg = mismatch("k", dots(BF, ONE, BF), phases)
    assert msg == ("kernel k, dot 2 of 3 (dot2): the model runs 1 pass (rne·rne), "
                   "Mosaic 6 passes (t2·t0, t0·t2, t1·t1, t1·t0, t0·t1, t0·t0)")
    # two dots of one group, Mosaic ran only one
    assert "dot 2 of 2 (dot2)" in mismatch("k", dots(ONE, ONE), [ONE[0]] + list(HIGHEST)[:1])
    # phases the model does not know of, after its last dot
    assert mismatch("k", dots(ONE), [ONE[0], BF[0]]) == ("kernel k: Mosaic runs 1 MXU phases after the model's 1 "
                                                         "dots (1 pass (bf16·bf16) first)")
    assert "Mosaic no MXU pass" in mismatch("k", dots(ONE), [])


def test_check_sums_passes_and_says_why_it_is_unverified():
    body = jax.make_jaxpr(lambda a, b: (a @ b) @ lax.dot(b, b, precision=lax.Precision.HIGHEST))(
        jnp.ones((8, 8)), jnp.ones((8, 8)))
    ok = mosaic_dump.check([("k", body)], {"k": [[ONE[0], *HIGHEST, ONE[0]]]})
    assert (ok.status, ok.dots, ok.passes_model, ok.passes_mosaic) == (VERIFIED, 3, 8, 8)
    assert ok.columns["mxu_check"] == VERIFIED
    missing = mosaic_dump.check([("k", body)], {})
    assert missing.status == UNVERIFIED and missing.columns["mxu_check"] == "unverified: no Mosaic LLO dump for kernel k"
    # one of two dumps of the name reads as the kernel: jax may compile two equal kernels once
    two = mosaic_dump.check([("k", body)], {"k": [[ONE[0]], [ONE[0], *HIGHEST, ONE[0]]]})
    assert two.status == VERIFIED
    bad = mosaic_dump.check([("k", body)], {"k": [[ONE[0], ONE[0], ONE[0]]]})
    assert bad.status == MISMATCH and "dot 2 of 3" in bad.reason and bad.passes_mosaic is None


def test_dump_dir_owned_is_emptied_and_a_users_is_only_read(tmp_path):
    (tmp_path / "1-0015-mosaic-dump-anonymous-post-lower-to-llo.txt").write_text(llo(phase("f32", "round")))
    theirs = DumpDir(str(tmp_path), owned=False)
    before = theirs.snapshot()
    assert len(before) == 1  # a user's directory: nothing removed
    (tmp_path / "2-0015-mosaic-dump-anonymous-post-lower-to-llo.txt").write_text(llo(phase("hi.f32", "high"), name="b"))
    assert theirs.read_since(before) == {"b": [[(HI8, HI8)]]}
    assert len(os.listdir(tmp_path)) == 2
    mine = DumpDir(str(tmp_path), owned=True)
    assert mine.snapshot() == set() and os.listdir(tmp_path) == []  # stale files of an owned directory go
    (tmp_path / "3-0015-mosaic-dump-anonymous-post-lower-to-llo.txt").write_text(llo(phase("f32", "round")))
    (tmp_path / "3-0001-mosaic-dump-anonymous-original.txt").write_text("module {}")
    assert mine.read_since(set()) == {"kernel_a": [[ONE[0]]]} and os.listdir(tmp_path) == []


def test_each_process_dumps_into_its_own_directory_and_a_users_flag_is_kept():
    env = {"LIBTPU_INIT_ARGS": "--xla_foo=1"}
    dump_mosaic_passes(env)
    assert env["LIBTPU_INIT_ARGS"].startswith("--xla_foo=1 --xla_mosaic_dump_to=/")
    assert env[MOSAIC_DUMP_OWNER] == str(os.getpid())
    mine = mosaic_dump.dump_dir(env)
    assert mine.owned and os.path.isdir(mine.path)
    child = {**env, MOSAIC_DUMP_OWNER: "1"}  # inherited from another process: replaced, not shared
    dump_mosaic_passes(child)
    assert mosaic_dump.dump_dir(child).path != mine.path and child["LIBTPU_INIT_ARGS"].count("dump_to") == 1
    users = {"LIBTPU_INIT_ARGS": "--xla_mosaic_dump_to=/their/dir"}
    dump_mosaic_passes(users)
    assert users == {"LIBTPU_INIT_ARGS": "--xla_mosaic_dump_to=/their/dir"}
    assert not mosaic_dump.dump_dir(users).owned
    assert mosaic_dump.dump_dir({}).why_not == "LIBTPU_INIT_ARGS has no --xla_mosaic_dump_to=DIR"


# ------------------------------------------------------------------------------- real compiles
def _two_dots(a_ref, b_ref, o_ref):
    x = lax.dot_general(a_ref[...], b_ref[...], mxu.NN, preferred_element_type=jnp.float32)
    o_ref[...] = lax.dot_general(x, b_ref[...], mxu.NN, precision=lax.Precision.HIGHEST,
                                 preferred_element_type=jnp.float32)


def _program(a, b):
    return pl.pallas_call(_two_dots, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32), name="two_dots")(a, b)


ARGS = (jax.ShapeDtypeStruct((8, 128), jnp.float32), jax.ShapeDtypeStruct((128, 128), jnp.float32))


@pytest.mark.parametrize("target", ["v5e", "v7x"])
def test_a_compile_reads_every_dots_passes(target):
    r = compile_for(_program, ARGS, target)
    assert r.ok, r.error
    assert r.kernel_columns["mxu_check"] == VERIFIED
    assert (r.mxu.dots, r.mxu.passes_model, r.mxu.passes_mosaic) == (2, 7, 7)  # DEFAULT f32 1 + HIGHEST 6


def test_a_model_that_claims_other_passes_is_an_error(monkeypatch):
    real = mxu.mxu_passes

    def claims_bf16x3_for_default(precision, a, b, **kw):  # the fault: the model, not the kernel, changed
        if precision in (None, lax.Precision.DEFAULT) and jnp.dtype(a) == jnp.float32:
            return real(lax.Precision.HIGH, a, b, pallas=False)
        return real(precision, a, b, **kw)

    monkeypatch.setattr(mxu, "mxu_passes", claims_bf16x3_for_default)
    r = compile_for(_program, ARGS, "v6e")
    assert r.status == "error" and r.mxu.status == MISMATCH
    assert r.error.startswith("MXU passes: kernel two_dots, dot 1 of 2 (f32[8,128] · f32[128,128] at DEFAULT, ")
    assert r.error.endswith("the model runs 3 passes (t1·t0, t0·t1, t0·t0), Mosaic 1 pass (rne·rne)")


def test_a_lowering_that_changes_one_dots_precision_is_an_error(monkeypatch):
    """The kernel's first dot says DEFAULT, and so does the model; the lowering, patched from the test, compiles
    it at HIGHEST: Mosaic's output gives it away."""
    from jax._src.pallas.mosaic import lowering

    rules = lowering.lowering_rules[next(iter(lowering.lowering_rules))]
    original = rules[lax.dot_general_p]

    @functools.wraps(original)
    def highest(ctx, x, y, dimension_numbers, precision, preferred_element_type, **kw):
        return original(ctx, x, y, dimension_numbers, (lax.Precision.HIGHEST,) * 2, preferred_element_type, **kw)

    monkeypatch.setitem(rules, lax.dot_general_p, highest)
    jax.clear_caches()
    r = compile_for(_program, ARGS, "v6e")
    jax.clear_caches()
    assert r.status == "error", r
    assert "dot 1 of 2 (f32[8,128] · f32[128,128] at DEFAULT" in r.error
    assert r.error.endswith("the model runs 1 pass (rne·rne), Mosaic 6 passes (t2·t0, t0·t2, t1·t1, t1·t0, "
                            "t0·t1, t0·t0)")


def test_without_a_dump_the_passes_are_unverified_never_a_silent_pass(monkeypatch):
    monkeypatch.setattr(tpu_compile, "dump_dir", lambda environ=None: DumpDir(None, False, "no dump here"))
    r = compile_for(_program, ARGS, "v6e")
    assert r.ok and r.kernel_columns["mxu_check"] == "unverified: no dump here"


# ------------------------------------------------------------------------------- dots Mosaic runs without the MXU
def _matvec_and_repeat(a_ref, b_ref, v_ref, o_ref):
    a, b = a_ref[...], b_ref[...]
    # f32[8,128] · f32[1,128] contracted on both last axes: a matrix-vector dot, at HIGHEST
    s = lax.dot_general(a, v_ref[...], mxu.NT_T, precision=lax.Precision.HIGHEST,
                        preferred_element_type=jnp.float32)
    once = lax.dot_general(a, b, mxu.NN, preferred_element_type=jnp.float32)
    again = lax.dot_general(a, b, mxu.NN, preferred_element_type=jnp.float32)  # the same dot of the same values
    o_ref[...] = once * again * s  # a product: an added term would become a dot's accumulator, another dot


def _matvec_program(a, b, v):
    return pl.pallas_call(_matvec_and_repeat, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                          name="matvec_and_repeat")(a, b, v)


MATVEC_ARGS = ARGS + (jax.ShapeDtypeStruct((1, 128), jnp.float32),)


def test_model_dots_drop_a_repeated_dot_and_give_a_matrix_vector_dot_no_pass():
    body = jax.make_jaxpr(lambda a, b, v: _matvec_and_repeat_values(a, b, v))(
        jnp.ones((8, 128)), jnp.ones((128, 128)), jnp.ones((1, 128)))
    found = mosaic_dump.model_dots(body)
    assert [d.passes for d in found] == [(), ONE]
    assert "on the VPU (f32 multiply-adds)" in found[0].label
    # a dot of other operands, or other parameters, is another dot
    other = jax.make_jaxpr(lambda a, b: (a @ b, a @ (b + 1), lax.dot(a, b, precision=lax.Precision.HIGHEST)))(
        jnp.ones((8, 8)), jnp.ones((8, 8)))
    assert len(mosaic_dump.model_dots(other)) == 3


def _matvec_and_repeat_values(a, b, v):
    s = lax.dot_general(a, v, mxu.NT_T, precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
    once = lax.dot_general(a, b, mxu.NN, preferred_element_type=jnp.float32)
    return once * lax.dot_general(a, b, mxu.NN, preferred_element_type=jnp.float32) * s


def _compiled_again(*args):
    """A compile that Mosaic runs again (a program jax compiled before is served from its cache: no dump)."""
    jax.clear_caches()
    try:
        return compile_for(*args)
    finally:
        jax.clear_caches()


def test_mosaic_runs_a_matrix_vector_dot_on_the_vpu_and_a_repeated_dot_once():
    """Read from libtpu's dump: the kernel's matrix-vector dot has no MXU phase (Mosaic's canonicalize-mosaic made
    it a multiply and a reduction), and its two equal dots one phase (MLIR's CSE): the check verifies 1 pass."""
    r = _compiled_again(_matvec_program, MATVEC_ARGS, "v6e")
    assert r.ok, r.error
    assert (r.mxu.status, r.mxu.dots, r.mxu.passes_model, r.mxu.passes_mosaic) == (VERIFIED, 2, 1, 1)


def test_a_model_that_puts_the_matrix_vector_dot_on_the_mxu_is_refuted_and_says_it_compiled(monkeypatch):
    """The fault, from the test side: the model without Mosaic's vector-unit rule. Mosaic's phases refute it; the
    program compiled all the same, and the reason says so (it never reads "does not compile")."""
    monkeypatch.setattr(mxu, "on_vector_unit", lambda *a: False)
    r = _compiled_again(_matvec_program, MATVEC_ARGS, "v6e")
    assert r.status == "error" and r.mxu.status == MISMATCH and r.compiled
    assert "dot 1 of 2 (f32[8,128] · f32[1,128] at HIGHEST" in r.error and "the model runs 6 passes" in r.error
    assert r.reason.startswith("compiled for TPU v6e, but not as the interpret-mode model runs it (its numbers "
                               "would not be the chip's): MXU passes: kernel matvec_and_repeat")
    assert "does not compile" not in r.reason


def test_a_model_that_counts_a_repeated_dot_twice_is_refuted(monkeypatch):
    """The fault: no two equations are the same computation (every one keyed apart), so the repeated dot is
    counted. Mosaic ran one MXU phase for the two."""
    import itertools

    counter = itertools.count()
    monkeypatch.setattr(mosaic_dump, "_params_key", lambda params: next(counter))
    r = _compiled_again(_matvec_program, MATVEC_ARGS, "v6e")
    assert r.mxu.status == MISMATCH and "dot 3 of 3" in r.error and r.error.endswith("Mosaic no MXU pass")


def _matvec_and_repeat_added(a_ref, b_ref, v_ref, o_ref):
    a, b = a_ref[...], b_ref[...]
    s = lax.dot_general(a, v_ref[...], mxu.NT_T, precision=lax.Precision.HIGHEST,
                        preferred_element_type=jnp.float32)
    once = lax.dot_general(a, b, mxu.NN, preferred_element_type=jnp.float32)
    again = lax.dot_general(a, b, mxu.NN, preferred_element_type=jnp.float32)
    o_ref[...] = once + again * s  # once's one use, an add: Mosaic makes the addend its accumulator


def test_a_repeated_dot_whose_result_is_added_is_a_dot_of_its_own():
    """``a + matmul(l, r, 0)`` becomes ``matmul(l, r, a)`` (Mosaic's CanonicalizeAddOfMatmul) before CSE runs: the
    two equal dots then differ in their accumulators and both run, two MXU phases, as the model counts them."""
    def program(a, b, v):
        return pl.pallas_call(_matvec_and_repeat_added, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                              name="matvec_and_repeat_added")(a, b, v)

    r = _compiled_again(program, MATVEC_ARGS, "v6e")
    assert r.ok, r.error
    assert (r.mxu.status, r.mxu.dots, r.mxu.passes_model, r.mxu.passes_mosaic) == (VERIFIED, 3, 2, 2)
