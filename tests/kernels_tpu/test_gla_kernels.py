"""GLA Pallas TPU kernels (interpret mode, MXU rounding modelled) vs the float64 reference.

Tolerances (relative L2, kernel vs float64 reference fed the SAME input bits):

- the kernels compute in f32; dots with an f32 operand run as bf16x3 (the one
  policy, kernels_tpu.mxu), whose products carry up to ~2**-16 relative error
  (the dropped lo*lo term and the split's residual), and the gate cumsums are
  exact. An f32-valued tensor (any fp32 case, and ht/dg/dg_gamma/dh0 which are
  float32 in every case) measured 2e-6 .. 8e-6; dg_gamma, one signed f32 sum
  per head of ~T*C*K terms with cancellation, 2.0e-5 (bf16, C128, steep
  ALiBi); bound ``F32_TOL = 4 * 2**-16`` (6.1e-5): four times the per-product
  bound, room for that cancellation, still 20x below a one-term bug (>1e-3);
- a bf16 output (o, dq, dk, dv of a bf16 case) is the f32 result rounded once
  to bf16: relative L2 of round-to-nearest is about 2**-8/sqrt(6)~1.6e-3
  (measured 1.63e-3..1.66e-3); bound ``BF16_TOL = 4e-3`` (one bf16 ulp, 2**-8).

Shapes are small (B1, T<=256, H2, K,V in {128,256}) and fixtures are module
scoped: the whole file is a few kernel launches per path.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels_tpu.gla import BlockSizes, chunk_gla, chunk_gla_bwd, chunk_gla_fwd, gla_dispatch
from references import gla as ref

F32_TOL = 4 * 2.0**-16
BF16_TOL = 4e-3
ALIBI_STEEP = -(2.0 ** -0.5)  # the steepest ALiBi slope: exp(0.7071*128) overflows f32


def rel(a, b) -> float:
    a = np.asarray(jnp.asarray(a, jnp.float32), np.float64)
    return float(np.linalg.norm((a - b).ravel()) / np.linalg.norm(np.asarray(b).ravel()))


def tol(name: str, dtype) -> float:
    f32_valued = name in ("ht", "dg", "dg_gamma", "dh0") or dtype == jnp.float32
    return F32_TOL if f32_valued else BF16_TOL


def make(B, T, H, K, V, dtype, gate, seed, h0=True, dht=True):
    """Inputs as jax arrays (kernel side) and their exact float64 values (reference side)."""
    r = np.random.default_rng(seed)
    x = {
        "q": jnp.asarray(r.standard_normal((B, T, H, K)), dtype),
        "k": jnp.asarray(r.standard_normal((B, T, H, K)), dtype),
        "v": jnp.asarray(r.standard_normal((B, T, H, V)), dtype),
        "do": jnp.asarray(r.standard_normal((B, T, H, V)), dtype),
    }
    if h0:
        x["h0"] = jnp.asarray(r.standard_normal((B, H, K, V)), jnp.float32)
    if dht:
        x["dht"] = jnp.asarray(r.standard_normal((B, H, K, V)), jnp.float32)
    if gate == "g":  # logsigmoid(N(0,1))/16 on head 0, ALiBi's steepest slope on every channel of head 1
        g = -np.logaddexp(0.0, -r.standard_normal((B, T, H, K))) / 16
        g[:, :, 1:] = ALIBI_STEEP
        x["g"] = jnp.asarray(g, jnp.float32)
    else:
        x["g_gamma"] = jnp.asarray([ALIBI_STEEP, -(2.0 ** -4)][:H], jnp.float32)
    x64 = {n: np.asarray(jnp.asarray(a, jnp.float32), np.float64) for n, a in x.items()}
    return x, x64


def reference(x64, scale=None):
    gate = {n: x64[n] for n in ("g", "g_gamma") if n in x64}
    o, ht = ref.chunk_gla(x64["q"], x64["k"], x64["v"], **gate, scale=scale, initial_state=x64.get("h0"),
                          output_final_state=True)
    grads = ref.chunk_gla_bwd(x64["q"], x64["k"], x64["v"], x64["do"], x64.get("dht"), **gate, scale=scale,
                              initial_state=x64.get("h0"))
    return {"o": o, "ht": ht, **{n: a for n, a in grads.items() if a is not None}}


def via_vjp(x, **kw):
    """chunk_gla under jax.vjp: o, ht and the gradients of sum(o*do) + sum(ht*dht)."""
    gate = "g" if "g" in x else "g_gamma"
    names = ["q", "k", "v", gate] + (["h0"] if "h0" in x else [])

    def f(*args):
        a = dict(zip(names, args))
        return chunk_gla(a["q"], a["k"], a["v"], **{gate: a[gate]}, initial_state=a.get("h0"),
                         output_final_state=True, interpret=True, **kw)

    (o, ht), vjp = jax.vjp(f, *(x[n] for n in names))
    dht = x.get("dht", jnp.zeros_like(ht))
    grads = vjp((x["do"], dht))
    return {"o": o, "ht": ht, **{"d" + n: gr for n, gr in zip(names, grads)}}


def check(got, want, dtype, label):
    errs = {n: rel(got[n], want[n]) for n in want if got.get(n) is not None}
    assert set(errs) == set(want), (label, set(want) - set(errs))
    bad = {n: e for n, e in errs.items() if not e <= tol(n, dtype)}
    assert not bad, (label, errs)
    return errs


# --------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def fused_bf16():
    """g_gamma, bf16, C128 (steep ALiBi: exp(90.5) would overflow), h0 + dht, via jax.vjp (fused path)."""
    x, x64 = make(1, 256, 2, 128, 128, jnp.bfloat16, "g_gamma", seed=1)
    return via_vjp(x, chunk_size=128), reference(x64)


@pytest.fixture(scope="module")
def fused_f32_wide():
    """g_gamma, fp32, K=V=256 (two K tiles reduced, two V tiles), C64, h0 + dht; explicit fwd/bwd."""
    x, x64 = make(1, 128, 2, 256, 256, jnp.float32, "g_gamma", seed=2)
    kw = dict(g_gamma=x["g_gamma"], initial_state=x["h0"], chunk_size=64, interpret=True)
    o, ht = chunk_gla_fwd(x["q"], x["k"], x["v"], output_final_state=True, **kw)
    grads = chunk_gla_bwd(x["q"], x["k"], x["v"], x["do"], x["dht"], **kw)
    return x, {"o": o, "ht": ht, **grads}, reference(x64)


@pytest.fixture(scope="module")
def chunk_f32_pad():
    """per-channel g, fp32, K=256, T=120 (padded to 2 chunks of 64), h0 + dht, via jax.vjp."""
    x, x64 = make(1, 120, 2, 256, 128, jnp.float32, "g", seed=3)
    return via_vjp(x, chunk_size=64), reference(x64)


@pytest.fixture(scope="module")
def chunk_bf16_c128():
    """per-channel g, bf16, C128 with a steep ALiBi head broadcast per channel; explicit fwd/bwd."""
    x, x64 = make(1, 256, 2, 128, 128, jnp.bfloat16, "g", seed=4, h0=False, dht=False)
    kw = dict(g=x["g"], chunk_size=128, interpret=True)
    o, ht = chunk_gla_fwd(x["q"], x["k"], x["v"], output_final_state=True, **kw)
    grads = chunk_gla_bwd(x["q"], x["k"], x["v"], x["do"], **kw)
    return {"o": o, "ht": ht, **grads}, reference(x64)


# ------------------------------------------------------------------ tests
def test_fused_g_gamma_bf16_c128(fused_bf16):
    got, want = fused_bf16
    errs = check(got, want, jnp.bfloat16, "fused bf16 C128")
    assert set(errs) == {"o", "ht", "dq", "dk", "dv", "dg_gamma", "dh0"}
    assert all(np.isfinite(np.asarray(jnp.asarray(a, jnp.float32))).all() for a in got.values())


def test_fused_g_gamma_f32_k256_v256(fused_f32_wide):
    _, got, want = fused_f32_wide
    check(got, want, jnp.float32, "fused f32 K256 V256")
    assert got["dg"] is None and got["dg_gamma"].shape == (2,)


def test_chunk_g_f32_k256_padded_t(chunk_f32_pad):
    got, want = chunk_f32_pad
    errs = check(got, want, jnp.float32, "chunk f32 K256 T120")
    assert set(errs) == {"o", "ht", "dq", "dk", "dv", "dg", "dh0"}
    assert got["dg"].dtype == jnp.float32 and got["dg"].shape == (1, 120, 2, 256)


def test_chunk_g_bf16_c128_steep(chunk_bf16_c128):
    got, want = chunk_bf16_c128
    check(got, want, jnp.bfloat16, "chunk bf16 C128")
    assert got["dh0"] is None and got["dg_gamma"] is None
    assert got["dq"].dtype == jnp.bfloat16 and got["dg"].dtype == jnp.float32


def test_chunk_path_with_g_gamma_matches_fused(fused_f32_wide):
    """path='chunk' broadcasts g_gamma per channel; autodiff sums dg into a real dg_gamma."""
    x, fused, want = fused_f32_wide
    got = via_vjp(x, chunk_size=64, path="chunk")
    check(got, want, jnp.float32, "chunk path, g_gamma")
    assert rel(got["dg_gamma"], np.asarray(fused["dg_gamma"], np.float64)) <= F32_TOL


def test_fault_drop_k_reduction_is_visible(fused_f32_wide, inject):
    """The named helper ``k_tile_reduction`` swapped for one that stops after the first K tile."""
    from faults import first_k_tile_only
    from kernels_tpu.gla import fused

    x, good, want = fused_f32_wide
    inject(fused, "k_tile_reduction", first_k_tile_only)
    o, _ = chunk_gla_fwd(x["q"], x["k"], x["v"], g_gamma=x["g_gamma"], initial_state=x["h0"], chunk_size=64,
                         interpret=True)
    assert rel(o, want["o"]) > 0.3  # half of K missing from q k^T and q S: grossly wrong
    assert rel(good["o"], want["o"]) <= F32_TOL


def test_dispatch():
    g, gg = object(), object()
    assert gla_dispatch(None, gg, "auto") == "fused"
    # T not a multiple of the chunk with a final state: the fused path cannot pad exactly
    assert gla_dispatch(None, gg, "auto", ragged_with_state=True) == "chunk"
    assert gla_dispatch(g, None, "auto") == "chunk"
    assert gla_dispatch(None, gg, "chunk") == "chunk"
    assert gla_dispatch(None, gg, "fused") == "fused"
    with pytest.raises(NotImplementedError, match="path='chunk'"):
        gla_dispatch(g, None, "fused")
    with pytest.raises(NotImplementedError, match="not both at once"):  # the contract's both gates: one here
        gla_dispatch(g, gg, "auto")
    with pytest.raises(ValueError):
        gla_dispatch(None, None, "auto")
    with pytest.raises(ValueError):
        gla_dispatch(None, gg, "fast")


def _args(T=64, K=128, V=128, dtype=jnp.float32):
    z = lambda *s: jnp.zeros(s, dtype)
    return z(1, T, 2, K), z(1, T, 2, K), z(1, T, 2, V)


@pytest.mark.parametrize("bad, err", [
    (dict(), ValueError),  # no gate
    (dict(g_gamma=jnp.zeros((3,))), ValueError),  # wrong H
    (dict(g_gamma=jnp.zeros((2,)), g=jnp.zeros((1, 64, 2, 128))), NotImplementedError),  # both: the contract's
    (dict(g_gamma=jnp.zeros(())), NotImplementedError),  # a scalar g_gamma: the contract's, [H] here
    (dict(g_gamma=jnp.zeros((2, 128))), NotImplementedError),  # an [H,K] g_gamma: the contract's, [H] here
    (dict(g_gamma=jnp.zeros((2, 3))), ValueError),  # no g_gamma form
    (dict(g_gamma=jnp.zeros((2,)), chunk_size=24), NotImplementedError),  # valid, not a multiple of 16
    (dict(g_gamma=jnp.zeros((2,)), initial_state=jnp.zeros((1, 2, 128, 64))), ValueError),
    (dict(g_gamma=jnp.zeros((2,)), path="fast"), ValueError),
    (dict(g=jnp.zeros((1, 64, 2, 128)), path="fused"), NotImplementedError),
    # the fused path cannot pad T exactly with a final state ("auto" takes the chunk path there)
    (dict(g_gamma=jnp.zeros((2,)), output_final_state=True, T=80, path="fused"), NotImplementedError),
])
def test_invalid_and_unsupported(bad, err):
    bad = dict(bad)
    shape = {n: bad.pop(n) for n in ("T", "K", "V") if n in bad}
    q, k, v = _args(**shape)
    with pytest.raises(err) as info:
        chunk_gla(q, k, v, interpret=True, **bad)
    if err is NotImplementedError:
        assert "=" in str(info.value)  # names the offending value and says the fix


@pytest.mark.parametrize("path, gate", [("fused", "g_gamma"), ("chunk", "g")])
def test_any_head_dim_runs_lane_padded(path, gate):
    """K and V need not be multiples of 128: padded internally (kernels_tpu.common.HeadPadding; exactness in
    test_head_dims_and_varlen.py). Shapes only: traced, not run."""
    for K, V in ((64, 128), (128, 192), (192, 64)):
        q, k, v = _args(K=K, V=V)
        g = ({"g_gamma": np.full((2,), -0.1, np.float32)} if gate == "g_gamma"
             else {"g": np.full((1, 64, 2, K), -0.1, np.float32)})
        o, ht = jax.eval_shape(lambda q, k, v: chunk_gla(q, k, v, **g, output_final_state=True, path=path,
                                                         interpret=True), q, k, v)
        assert o.shape == (1, 64, 2, V) and ht.shape == (1, 2, K, V)


def test_mixed_dtypes_rejected():
    q, k, v = _args()
    with pytest.raises(ValueError, match="dtype"):
        chunk_gla(q.astype(jnp.bfloat16), k, v, g_gamma=jnp.zeros((2,)), interpret=True)


def test_block_sizes_validate():
    """One BlockSizes for every op (kernels_tpu.common): invalid values are ValueError, a valid chunk size
    the kernels do not implement is NotImplementedError naming it."""
    assert BlockSizes().chunk_size == 64 and BlockSizes().block_v_for(192) == 128
    for bad in (dict(chunk_size=0), dict(chunk_size=True), dict(sub_chunk=12), dict(block_v=100), dict(num_steps=0)):
        with pytest.raises(ValueError):
            BlockSizes(**bad)
    with pytest.raises(NotImplementedError, match="chunk_size=40"):
        BlockSizes(chunk_size=40)
    assert BlockSizes(num_steps=3).for_chunks(4).num_steps == 2


