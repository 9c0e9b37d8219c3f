"""Any team's implementation as the candidate (issue 21): the leg registry, --impl and entry points, forward-only
candidates, an implementation that interprets but does not compile for a real TPU, gradients declared absent by
design, and implementations that do not load (issue 36).

The implementation under test is a tiny package written to a temporary directory with a ``.dist-info`` whose
entry points name it, as ``pip install`` would leave it. Its kernels are this project's simple_gla kernels,
called through the binding protocol without their ``interpret`` argument: the external leg must force
interpret mode itself, answer ``get_tpu_info`` and round every dot as the MXU does. So its rows must equal the
TPU leg's: o, ht, dq, dk, dv bit for bit; dg, whose in-kernel sums XLA compiles into another program here, to
a few ULPs."""

import textwrap

import pandas as pd
import pytest

from harness.app import find_case
from harness.cli import main
from harness.legs import registry

pytest_plugins = ["pytester"]

CASE = "simple_gla.chunk/B1-T64-H2-K64-V64/bf16/g=logsigmoid/16/C64"

PACKAGE = '''
"""A kernel team's package, as this harness sees it: an implementation object per variant."""
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from harness.ops.base import LegBinding
from kernels_tpu.simple_gla import chunk_simple_gla


def forward(case, a, ctx):
    # no interpret argument: the candidate leg forces interpret mode on every pallas_call
    o, ht = chunk_simple_gla(a["q"], a["k"], a["v"], g=a.get("g"), scale=case.resolved_scale,
                             initial_state=a.get("h0"), output_final_state=case.final_state,
                             chunk_size=case.chunk_size)
    return {"o": o, "ht": ht}


def _fp16_load(x_ref, o_ref):
    o_ref[...] = x_ref[...].astype(jnp.float32)


def forward_with_an_fp16_load(case, a, ctx):
    out = forward(case, a, ctx)
    flat = out["o"].reshape(-1, out["o"].shape[-1]).astype(jnp.float32)
    touched = pl.pallas_call(_fp16_load, out_shape=jax.ShapeDtypeStruct(flat.shape, jnp.float32))(
        flat.astype(jnp.float16))  # interprets; Mosaic cannot load fp16
    return {**out, "o": out["o"] + 0 * touched.reshape(out["o"].shape).astype(out["o"].dtype)}


def forward_wider(case, a, ctx):
    # o computed from float32 inputs and returned in float32 for a bf16 case: more precision than a bf16 o holds
    wide = {n: x.astype(jnp.float32) if n in ("q", "k", "v") else x for n, x in a.items()}
    return forward(case, wide, ctx)


def raises(case, a, ctx):
    raise RuntimeError("the kernel team's bug")


def forward_with_a_constant_gate(case, a, ctx):
    # the gate taken as a constant (as tops takes g_gamma): its gradient comes back as zeros
    return forward(case, {**a, "g": jax.lax.stop_gradient(a["g"])}, ctx)


class Impl:
    def __init__(self, binding):
        self.bindings = {"simple_gla": binding}
        self.version = "tiny 1.0"


class Unbound:
    version = "tiny 1.0"


FULL = Impl(LegBinding(forward))
FORWARD_ONLY = Impl(LegBinding(forward, differentiable=False))
NO_COMPILE = Impl(LegBinding(forward_with_an_fp16_load, differentiable=False))
RAISES = Impl(LegBinding(raises))
WIDER = Impl(LegBinding(forward_wider, differentiable=False))
CONSTANT_GATE = Impl(LegBinding(forward_with_a_constant_gate,
                                no_gradient=lambda case: {"g": "the gate is a constant here"}))
CONSTANT_GATE_UNDECLARED = Impl(LegBinding(forward_with_a_constant_gate))
MISDECLARED = Impl(LegBinding(forward, no_gradient=lambda case: {"g_gamma": "a gate this case does not take"}))
UNREASONED = Impl(LegBinding(forward, no_gradient=lambda case: {"g": ""}))
NO_BINDINGS = Unbound()
'''

ENTRY_POINTS = """
[linear_attn_parity.implementations]
tiny = tiny_impl:FULL
tiny-fwd = tiny_impl:FORWARD_ONLY
tiny-broken = tiny_impl:NO_COMPILE
tiny-wide = tiny_impl:WIDER
tiny-gone = tiny_impl_that_is_not_installed:IMPLEMENTATION
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A directory holding the installed package ``tiny-impl`` (code and dist-info)."""
    root = tmp_path_factory.mktemp("site")
    (root / "tiny_impl").mkdir()
    (root / "tiny_impl" / "__init__.py").write_text(PACKAGE)
    info = root / "tiny_impl-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tiny-impl\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(ENTRY_POINTS))
    return root


@pytest.fixture
def installed(site, monkeypatch):
    """The package importable and its entry points visible; the registry as a fresh process would have it."""
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(registry, "_LEGS", {spec.name: spec for spec in registry.BUILTIN})
    monkeypatch.setattr(registry, "_entry_points_loaded", False)
    return site


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """The GPU leg's rows (emulated fla) and the TPU leg's rows of CASE, as files."""
    out = tmp_path_factory.mktemp("legs")
    for leg in ("gpu", "tpu"):
        assert main(["run", "--backend", leg, "--case", CASE, "--out", str(out), "--no-progress"]) == 0
    return out


def _rows(out, leg):
    [path] = out.glob(f"{leg}.cases-*.csv")
    return path, pd.read_csv(path)


def test_mxu_rounding_rounds_an_f32_dot_as_the_mxu_does():
    """(1 + 2^-10) . 1 in f32: XLA:CPU is exact; a TPU's DEFAULT pass rounds the operand to bf16 (1.0), HIGHEST
    keeps it. Inside a Pallas kernel in forced interpret mode, and in plain jitted code."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    from harness.legs.external import mxu_rounding
    from kernels_tpu.mxu import MxuTally, tally_mxu_work

    def kernel(a_ref, b_ref, o_ref, *, precision):
        o_ref[...] = lax.dot_general(a_ref[...], b_ref[...], (((1,), (0,)), ((), ())), precision=precision,
                                     preferred_element_type=jnp.float32)

    a = jnp.full((8, 128), 1.0 + 2.0**-10, jnp.float32)
    b = jnp.zeros((128, 128), jnp.float32).at[0, :].set(1.0)

    def run(precision):
        jax.clear_caches()
        call = pl.pallas_call(lambda *r: kernel(*r, precision=precision),
                              out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))
        return float(call(a, b)[0, 0]), float(jax.jit(lambda x, y: lax.dot_general(
            x, y, (((1,), (0,)), ((), ())), precision=precision))(a, b)[0, 0])

    with pltpu.force_tpu_interpret_mode(pltpu.InterpretParams()):
        assert run(None) == (1.0 + 2.0**-10,) * 2  # no model: XLA:CPU's exact f32
        tally = MxuTally()
        with mxu_rounding(), tally_mxu_work(tally):
            assert run(None) == (1.0, 1.0)
            assert run(lax.Precision.HIGHEST) == (1.0 + 2.0**-10,) * 2
        assert run(None) == (1.0 + 2.0**-10,) * 2  # the model ends with its block
    jax.clear_caches()
    assert tally.macs and tally.ratio > 1  # the kernel's dots were counted, HIGHEST at six passes


def test_mxu_rounding_differentiates_a_dot_as_a_tpu_does():
    """Autodiff through a candidate's pure-JAX dot inside the model: the gradient is the dot's, its two cotangent
    dots modeled at the dot's precision (the model's bf16 split is a bit mask, whose own derivative is zero: every
    such gradient came back zero before; ejkernel's T > 1 path, reports/peers/ejkernel).

    loss = sum(a @ b), so dloss/da[i, j] = sum_k b[j, k], the cotangent dot ones @ b^T. At DEFAULT precision a TPU
    rounds b to bf16 in that dot: the gradient is the row sums of bf16(b), not of b. With operands bf16 holds
    exactly (ones, 0.5) at HIGHEST, the modeled gradient is the exact one bit for bit."""
    import jax
    import jax.numpy as jnp
    import ml_dtypes
    import numpy as np

    from harness.legs.external import mxu_rounding

    def loss(a, b, precision=None):
        return jnp.einsum("ij,jk->ik", a, b, precision=precision).sum()

    def modeled_grad(*args, **kw):
        with mxu_rounding():
            jax.clear_caches()
            grad = jax.grad(loss)(*args, **kw)
        jax.clear_caches()
        return np.asarray(grad, np.float64)

    a, b = jnp.ones((4, 8), jnp.float32), jnp.full((8, 3), 0.5, jnp.float32)
    highest = dict(precision=jax.lax.Precision.HIGHEST)
    assert np.array_equal(modeled_grad(a, b, **highest), np.asarray(jax.grad(loss)(a, b, **highest)))

    b = jnp.asarray(np.random.default_rng(0).standard_normal((8, 3)), jnp.float32)
    got = modeled_grad(a, b)[0]
    rounded = np.asarray(b).astype(ml_dtypes.bfloat16).astype(np.float64).sum(axis=1)
    exact = np.asarray(b, np.float64).sum(axis=1)
    assert np.max(np.abs(got - rounded)) <= 1e-6 * np.max(np.abs(rounded))  # f32 sums of the bf16 values
    assert np.max(np.abs(got - exact)) > 1e-4 * np.max(np.abs(exact))  # bf16's 2^-9 shows, f32's 2^-24 would not


def test_mxu_rounding_transposes_a_dot_made_on_a_tangent():
    """A dot bound on a linear input (another primitive's derivative makes one: solve_triangular's JVP multiplies
    its tangents) must transpose. The model's dot is bilinear, as lax.dot_general is; a custom_vjp there raised
    "Transpose rule ... for 'custom_vjp_call' not implemented" (ejkernel 0.0.78 to 0.0.80.3's T > 1 gradients).

    The transpose of t -> t @ b at DEFAULT is ct -> ct @ b^T, itself a dot a TPU runs in one bf16 pass: with
    ct = ones, the row sums of bf16(b). With operands bf16 holds exactly (powers of 2), solve_triangular's
    gradient is the exact one, bit for bit."""
    import jax
    import jax.numpy as jnp
    import ml_dtypes
    import numpy as np

    from harness.legs.external import mxu_rounding

    b = jnp.asarray(np.random.default_rng(0).standard_normal((8, 3)), jnp.float32)
    with mxu_rounding():
        jax.clear_caches()
        (got,) = jax.linear_transpose(lambda t: jnp.dot(t, b), jnp.ones((4, 8), jnp.float32))(
            jnp.ones((4, 3), jnp.float32))
    jax.clear_caches()
    rounded = np.asarray(b).astype(ml_dtypes.bfloat16).astype(np.float64).sum(axis=1)
    assert np.max(np.abs(np.asarray(got[0], np.float64) - rounded)) <= 1e-6 * np.max(np.abs(rounded))
    assert not np.allclose(np.asarray(got[0]), np.asarray(b, np.float64).sum(axis=1), rtol=1e-4, atol=0)

    def loss(lower, rhs):
        x = jax.scipy.linalg.solve_triangular(lower, rhs, lower=True)
        return jnp.sum(jnp.dot(x, jnp.full((2, 2), 0.5), precision=jax.lax.Precision.HIGHEST))

    lower = jnp.tril(jnp.full((4, 4), 0.25)) + jnp.eye(4) * 1.75  # diagonal 2, below it 1/4
    rhs = jnp.full((4, 2), 4.0)
    exact = jax.grad(loss, argnums=(0, 1))(lower, rhs)
    with mxu_rounding():
        jax.clear_caches()
        modeled = jax.grad(loss, argnums=(0, 1))(lower, rhs)
    jax.clear_caches()
    for e, m in zip(exact, modeled):
        assert np.any(np.asarray(e) != 0) and np.array_equal(np.asarray(e), np.asarray(m))


def test_a_kernels_matrix_vector_dot_runs_as_mosaic_runs_it():
    """Inside a kernel (a signature the program's kernels have, harness.compile.xla_dots), an f32 matrix-vector
    dot is Mosaic's VPU multiply-reduce (kernels_tpu.mxu.on_vector_unit): x = 1 + 2^-12, four f32 products
    1 + 2^-11 summed to 4 + 2^-9. The same dot elsewhere stays the MXU's one bf16 pass at DEFAULT: 4."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from harness.compile import xla_dots
    from harness.legs import external

    a, v = jnp.full((2, 4), 1.0 + 2.0**-12, jnp.float32), jnp.full((4,), 1.0 + 2.0**-12, jnp.float32)
    sig = xla_dots.signature(a, v, (((1,), (0,)), ((), ())), None)

    def run(xla):
        external._local.xla = xla
        try:
            with external.mxu_rounding():
                jax.clear_caches()
                return np.asarray(jax.lax.dot_general(a, v, (((1,), (0,)), ((), ()))))
        finally:
            external._local.xla = None
            jax.clear_caches()

    assert np.all(run(xla_dots.XlaDots(kernel=frozenset({sig}))) == 4.0 + 2.0**-9)
    assert np.all(run(xla_dots.XlaDots()) == 4.0)


def test_tpu_info_answers_for_the_chip_compiled_for():
    from jax.experimental.pallas import tpu as pltpu

    from harness.legs.external import tpu_info_for

    with pytest.raises(ValueError, match="Unsupported TPU device kind"):
        pltpu.get_tpu_info()
    with tpu_info_for("v5e"):
        v5e = pltpu.get_tpu_info()
    with tpu_info_for("v7x"):
        v7x = pltpu.get_tpu_info()
    assert v5e.num_lanes == v7x.num_lanes == 128 and v5e != v7x
    with pytest.raises(ValueError, match="Unsupported TPU device kind"):
        pltpu.get_tpu_info()  # restored


def test_the_registry_describes_every_leg():
    legs = registry.legs()
    assert [legs[n].role for n in ("ref", "gpu", "tpu")] == ["reference", "baseline", "candidate"]
    assert (registry.default_leg("baseline"), registry.default_leg("candidate")) == ("gpu", "tpu")
    assert [legs[n].version_key for n in ("ref", "gpu", "tpu")] == ["numpy", "triton", "libtpu"]
    with pytest.raises(ValueError, match="must be NAME=module:object"):
        registry.parse_impl("tiny")
    with pytest.raises(ValueError, match="already registered"):
        registry.register_implementation("tpu", "x:y")
    with pytest.raises(ValueError, match="unknown leg 'nope'.*--impl"):
        registry.leg_spec("nope")


@pytest.mark.needs_leg("gpu")
def test_an_installed_implementation_gates_through_the_cli(installed, baseline, tmp_path):
    assert "tiny" in registry.legs()  # from its entry point
    assert main(["run", "--backend", "tiny", "--case", CASE, "--out", str(tmp_path), "--no-progress"]) == 0
    path, rows = _rows(tmp_path, "tiny")
    assert set(rows["leg"]) == {"tiny"} and set(rows["status"]) == {"ok"} and set(rows["compiled_for"]) == {"v6e"}
    assert "tiny 1.0" in rows["versions"].iloc[0]
    # the same kernels as the TPU leg, interpreted and MXU-rounded by the leg, not by their own arguments
    _, tpu = _rows(baseline, "tpu")
    mine, theirs = rows.set_index("tensor")["rel_l2"], tpu.set_index("tensor")["rel_l2"]
    # equal to 1e-6 of the error: the two legs jit the same kernels into different XLA:CPU programs, and on some
    # CPUs one bf16 rounding of o lands one ulp apart (measured here, at 9c0543d too: o's rel_l2 2.342250774e-3
    # vs 2.342250786e-3, a 5e-9 relative difference; ht, dq, dk, dv bit-equal). A leg that rounded its own dots,
    # or not at all, moves these by 1e-2 and more.
    same = ["o", "ht", "dq", "dk", "dv"]
    assert ((mine[same] / theirs[same] - 1).abs() < 1e-6).all(), (mine[same], theirs[same])
    assert abs(mine["dg"] / theirs["dg"] - 1) < 1e-4
    gpu, _ = _rows(baseline, "gpu")
    assert main(["gate", str(gpu), str(path), "--candidate-leg", "tiny", "--out", str(tmp_path / "g")]) == 0
    md = (tmp_path / "g" / "parity.md").read_text()
    assert md.startswith("## Linear-attention parity: PASS\n") and "candidate (tiny)" in md


@pytest.mark.needs_leg("gpu")
def test_a_tensor_wider_than_declared_is_compared_as_the_declared_dtype_holds_it(installed, baseline, tmp_path):
    """A candidate returning a bf16 case's o in float32 (computed from float32 inputs: rel-L2 near 1e-6 as returned)
    is compared after rounding o to bf16, as its users hold it: its error is then bf16's (at least 2^-10 of o over
    4096 elements of unit scale), equal to the TPU leg's rounding of the same numbers, and the row says what came
    back. It never passes on the difference."""
    import json

    import numpy as np

    assert main(["run", "--backend", "tiny-wide", "--case", CASE, "--out", str(tmp_path), "--no-progress"]) == 0
    _, rows = _rows(tmp_path, "tiny-wide")
    o = rows[rows.tensor == "o"].iloc[0]
    assert o.rel_l2 > 2.0**-10
    assert json.loads(o.details)["returned_dtypes"] == {"o": "float32 returned, compared as bfloat16"}
    _, tpu = _rows(baseline, "tpu")
    assert o.rel_l2 < 2 * float(tpu[tpu.tensor == "o"].rel_l2.iloc[0])  # bf16's rounding, as the TPU leg's o
    ht = rows[rows.tensor == "ht"]
    assert ht.empty or "ht" not in json.loads(o.details)["returned_dtypes"]  # float32 as declared: untouched
    assert np.isfinite(o.rel_l2)


@pytest.mark.needs_leg("gpu")
def test_a_forward_only_pass_says_so(installed, baseline, tmp_path):
    assert main(["run", "--backend", "tiny-fwd", "--case", CASE, "--out", str(tmp_path), "--no-progress"]) == 0
    path, rows = _rows(tmp_path, "tiny-fwd")
    grads = rows[rows["tensor"].str.startswith("d")]
    assert len(grads) and set(grads["status"]) == {"not_provided"}
    assert grads["reason"].str.startswith("forward-only implementation").all()
    gpu, _ = _rows(baseline, "gpu")
    junit = tmp_path / "junit.xml"
    assert main(["gate", str(gpu), str(path), "--candidate-leg", "tiny-fwd", "--out", str(tmp_path / "g"),
                 "--junit", str(junit)]) == 0
    md = (tmp_path / "g" / "parity.md").read_text()
    assert md.startswith(f"## Linear-attention parity: PASS, FORWARD ONLY ({len(grads)} gradient")
    assert "**Forward only**" in md and "not compared" in md
    assert "FORWARD ONLY" in (tmp_path / "g" / "parity.html").read_text()
    assert 'value="PASS, FORWARD ONLY' in junit.read_text()
    # the same gate against a candidate that claims to differentiate but gives no gradient fails
    claims = rows.assign(reason=rows["reason"].str.replace("forward-only implementation", "a kernel"))
    claims.to_csv(tmp_path / "claims.csv", index=False)
    assert main(["gate", str(gpu), str(tmp_path / "claims.csv"), "--candidate-leg", "tiny-fwd",
                 "--out", str(tmp_path / "g2")]) == 1


@pytest.mark.needs_leg("gpu")
def test_an_implementation_that_does_not_compile_fails(installed, baseline, tmp_path):
    assert main(["run", "--backend", "tiny-broken", "--case", CASE, "--out", str(tmp_path), "--no-progress"]) == 1
    path, rows = _rows(tmp_path, "tiny-broken")
    assert set(rows["status"]) == {"error"}
    assert rows["reason"].str.startswith("does not compile for TPU v6e: MosaicError").all()
    gpu, _ = _rows(baseline, "gpu")
    assert main(["gate", str(gpu), str(path), "--candidate-leg", "tiny-broken", "--out", str(tmp_path / "g")]) == 1


def test_impl_on_the_command_line_and_a_raising_binding(installed, tmp_path, capsys):
    code = main(["run", "--backend", "mine", "--impl", "mine=tiny_impl:RAISES", "--case", CASE,
                 "--case", "simple_gla.chunk/B1-T64-H2-K128-V128/bf16/g=logsigmoid/16/C64", "--out", str(tmp_path),
                 "--no-progress"])
    assert code == 1  # error rows, and the run went on to the second case
    _, rows = _rows(tmp_path, "mine")
    assert rows["case_id"].nunique() == 2 and set(rows["status"]) == {"error"}
    # it raised while the leg traced it to ask whether it takes the case: the rows say so
    assert rows["reason"].str.startswith("forward failed while tracing for the refusal check: "
                                         "RuntimeError: the kernel team's bug").all()
    assert main(["run", "--backend", "other", "--impl", "other", "--case", CASE, "--out", str(tmp_path)]) == 2
    assert "must be NAME=module:object" in capsys.readouterr().err
    assert find_case(CASE)  # the case is the suite's, unchanged


@pytest.mark.needs_leg("gpu")
def test_pytest_gates_an_installed_candidate(installed, baseline, pytester, monkeypatch):
    """``pytest -m tpu --parity-candidate NAME``: the tpu-marked test runs the named candidate; a forward-only
    one passes and the terminal says loudly that the gradients were not compared."""
    from pathlib import Path

    monkeypatch.setenv("PYTHONPATH", str(installed))
    pytester.makepyfile(test_legs=(Path(__file__).parent / "test_hardware_legs.py").read_text())
    gpu, _ = _rows(baseline, "gpu")
    out = pytester.path / "out"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-m", "tpu", "--parity-case", CASE,
                                           "--gpu-results", str(gpu), "--parity-candidate", "tiny-fwd",
                                           f"--parity-out={out}")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*tiny-fwd is FORWARD ONLY*not compared*"])
    assert set(pd.read_csv(next(out.glob("tiny-fwd.cases-*.csv")))["leg"]) == {"tiny-fwd"}
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-m", "tpu", "--parity-case", CASE,
                                           "--gpu-results", str(gpu), "--parity-candidate", "gpu")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*--parity-candidate gpu is the baseline leg, not a candidate*"])


@pytest.mark.needs_leg("gpu")
def test_rows_of_an_implementation_not_installed_here_are_gated(baseline, tmp_path, capsys):
    """Gating needs only the files: a candidate's rows name their leg in `versions`, as an external leg writes
    them, whether or not the implementation is installed on the machine that gates."""
    import json

    gpu, tpu_path = _rows(baseline, "gpu")[0], _rows(baseline, "tpu")[0]
    tpu = pd.read_csv(tpu_path)
    theirs = tpu.assign(leg="theirs", versions=[json.dumps({**json.loads(v), "theirs": "theirs 2.0"})
                                                for v in tpu["versions"]])
    theirs.to_csv(tmp_path / "theirs.csv", index=False)
    assert "theirs" not in registry.legs()
    assert main(["gate", str(gpu), str(tmp_path / "theirs.csv"), "--candidate-leg", "theirs",
                 "--out", str(tmp_path / "g")]) == 0
    unnamed = tpu.assign(leg="theirs")  # rows that claim the leg but do not name it in versions
    unnamed.to_csv(tmp_path / "unnamed.csv", index=False)
    assert main(["gate", str(gpu), str(tmp_path / "unnamed.csv"), "--candidate-leg", "theirs",
                 "--out", str(tmp_path / "g")]) == 2
    assert "names no theirs" in capsys.readouterr().err
    tpu.assign(leg="Their Kernels").to_csv(tmp_path / "bad.csv", index=False)
    assert main(["gate", str(gpu), str(tmp_path / "bad.csv"), "--candidate-leg", "theirs",
                 "--out", str(tmp_path / "g")]) == 2
    assert "is not a leg name" in capsys.readouterr().err


def test_an_implementation_that_does_not_load_is_one_line_and_exit_2(installed, tmp_path, capsys):
    """A module that does not import, an object that is not there, an object without bindings: one line on stderr,
    exit 2, before any work. A broken entry point (tiny-gone) breaks only the commands that run its leg."""
    for name, target, says in (
            ("absent", "tiny_impl_missing:IMPL", "does not load (ModuleNotFoundError: No module named"),
            ("misnamed", "tiny_impl:NOPE", "does not load (AttributeError: module 'tiny_impl' has no attribute"),
            ("unbound", "tiny_impl:NO_BINDINGS", "has no bindings: its object needs `bindings`")):
        assert main(["run", "--backend", name, "--impl", f"{name}={target}", "--case", CASE,
                     "--out", str(tmp_path), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"parity: error: implementation {name}={target} {says}") and err.count("\n") == 1, err
    assert not list(tmp_path.iterdir())  # no result file was started
    assert "tiny-gone" in registry.legs() and main(["cases", "--case", CASE]) == 0  # registered, never imported
    assert main(["run", "--backend", "tiny-gone", "--case", CASE, "--out", str(tmp_path), "--no-progress"]) == 2
    assert "implementation tiny-gone=tiny_impl_that_is_not_installed:IMPLEMENTATION does not load" in \
        capsys.readouterr().err
    assert main(["all", "--candidate", "tiny-gone", "--case", CASE, "--out", str(tmp_path), "--no-progress"]) == 2
    assert "tiny-gone" in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_a_no_gradient_declaration_must_name_a_differentiable_input(installed, tmp_path):
    """A declared name that is not a differentiable input of the case (simple_gla with g has q, k, v, g), or a
    declaration without a reason, makes the case's rows error rows that say so; nothing crashes."""
    for target, says in (("MISDECLARED", "declares no gradient for 'g_gamma', which is not a differentiable input "
                                         "of this case (q, k, v, g)"),
                         ("UNREASONED", "declares no gradient for 'g' without a reason")):
        name = target.lower()
        assert main(["run", "--backend", name, "--impl", f"{name}=tiny_impl:{target}", "--case", CASE,
                     "--out", str(tmp_path), "--no-progress"]) == 1
        _, rows = _rows(tmp_path, name)
        assert set(rows["status"]) == {"error"} and rows["reason"].str.contains(says, regex=False).all(), \
            rows["reason"].iloc[0]


@pytest.mark.needs_leg("gpu")
def test_a_gradient_absent_by_design_is_not_compared_and_the_headline_counts_it(installed, baseline, tmp_path):
    """The binding declares dg absent by design (its forward takes the gate as a constant): dg's row is
    not_provided with the binding's reason, and the gate passes with a headline that counts it. The same forward
    undeclared gives a zero dg, which fails its bound and the gate."""
    gpu, _ = _rows(baseline, "gpu")
    assert main(["run", "--backend", "constant", "--impl", "constant=tiny_impl:CONSTANT_GATE", "--case", CASE,
                 "--out", str(tmp_path), "--no-progress"]) == 0
    path, rows = _rows(tmp_path, "constant")
    by = rows.set_index("tensor")
    assert by.at["dg", "status"] == "not_provided"
    assert by.at["dg", "reason"] == "no gradient by design: the gate is a constant here"
    assert set(by.drop(index="dg")["status"]) == {"ok"}
    junit = tmp_path / "junit.xml"
    assert main(["gate", str(gpu), str(path), "--candidate-leg", "constant", "--out", str(tmp_path / "g"),
                 "--junit", str(junit)]) == 0
    md = (tmp_path / "g" / "parity.md").read_text()
    headline = "PASS, NO GRADIENT BY DESIGN (1 gradient tensor(s) of the baseline not compared)"
    assert md.startswith(f"## Linear-attention parity: {headline}\n")
    assert "**No gradient by design**" in md and "dg (the gate is a constant here)" in md
    assert headline in (tmp_path / "g" / "parity.html").read_text()
    assert f'value="{headline}"' in junit.read_text()

    assert main(["run", "--backend", "undeclared", "--impl", "undeclared=tiny_impl:CONSTANT_GATE_UNDECLARED",
                 "--case", CASE, "--out", str(tmp_path), "--no-progress"]) == 1
    path, rows = _rows(tmp_path, "undeclared")
    dg = rows.set_index("tensor").loc["dg"]
    assert dg["status"] == "bound" and dg["rel_l2"] == 1.0  # zeros, compared as any gradient
    assert main(["gate", str(gpu), str(path), "--candidate-leg", "undeclared", "--out", str(tmp_path / "g2")]) == 1


@pytest.mark.needs_leg("gpu")
def test_all_gates_a_candidate_against_baseline_rows_made_elsewhere(installed, baseline, tmp_path, capsys):
    """A TPU-side stack has no torch: ``parity all --baseline-rows GPU.csv`` takes fla's rows from the machine
    where fla runs, runs the candidates here, and gates them (the tops recipe, docs/ci.md)."""
    gpu, _ = _rows(baseline, "gpu")
    out = tmp_path / "all"
    assert main(["all", "--case", CASE, "--baseline-rows", str(gpu), "--candidate", "tiny", "--no-causality",
                 "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert f"gpu: 1 cases' rows from {gpu}" in printed and "gpu leg" not in printed  # not run here
    assert (out / "parity.md").read_text().startswith("## Linear-attention parity: PASS")
    assert (out / "tiny" / "parity.md").exists() and "tiny" in (out / "peers.md").read_text()
    _, tpu = _rows(baseline, "tpu")
    tpu_path = tmp_path / "tpu.csv"
    tpu.to_csv(tpu_path, index=False)
    assert main(["all", "--case", CASE, "--baseline-rows", str(tpu_path), "--out", str(out)]) == 2
    assert "holds rows of tpu, not of the gpu leg" in capsys.readouterr().err
    other = "simple_gla.chunk/B1-T64-H2-K128-V128/bf16/g=logsigmoid/16/C64"
    assert main(["all", "--case", CASE, "--case", other, "--baseline-rows", str(gpu), "--out", str(out)]) == 2
    assert f"lacks 1 of the 2 selected cases (first: {other})" in capsys.readouterr().err
