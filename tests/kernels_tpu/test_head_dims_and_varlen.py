"""Head dims that are not multiples of 128 (lane padding) and packed variable-length sequences
(``cu_seqlens``) in every op and variant's Pallas kernels, interpret mode, MXU model on.

Every run is the op's differentiable public function under ``jax.vjp`` inside one ``jax.jit`` (the
forward kernels, then the backward kernels of its custom VJP), returning o, ht and the gradients of
``sum(o * do) + sum(ht * dht)``. The configurations (:data:`CASES`) cover simple_gla chunk (per-token
g, bf16) and fused_chunk (g_gamma), gla's chunk (per-channel g) and fused (g_gamma) paths, and kda
with its in-kernel gate and beta sigmoid (per-token preprocessing that must happen before padding).
Packed rows ``LENS = (37, 1, 90)`` with chunk size 32 put both boundaries inside one chunk and give
sequences whose last chunk is short; K = V = 64. gla's fused g_gamma path pads exactly with a final
state only when every sequence is whole chunks (kernels_tpu.gla.api), so its case packs (64, 32, 96):
rows padded by whole chunks, which its kernels skip.

What is asserted:

- **Lane padding is exact** (:func:`test_head_dim_64_equals_explicit_zero_padding_to_128`): the kernels
  at K = V = 64 equal, bit for bit, the kernels run on the same inputs explicitly zero-padded to
  K = V = 128 (the same scale, 64**-0.5), every output sliced back. The one exception is kda's
  ``dA_log``: a reduction over the channels that XLA may order differently for 64 and 128 of them;
  it is held to 1e-6 relative.
- **Packing is exact** (:func:`test_packed_equals_separate_sequences`): the packed run equals the N
  separate B = 1 runs of its sequences bit for bit (o, ht, every per-token gradient, dh0); the
  gradients of shared parameters (dg_gamma, kda's dA_log and ddt_bias) are sums over the sequences,
  equal to the separate runs' sum up to summation order: 1e-6 relative.
- **Accuracy** (:func:`test_against_float64_reference`, one case per op): the packed K = V = 64 run
  against the float64 reference with the same cu_seqlens, within the bounds of the per-op kernel tests: rel-L2
  ``4 * 2**-16`` for float32 inputs; ``1e-2`` (~2.5 bf16 ulps) for every tensor of a bf16 case, whose
  float32 outputs (ht, dg, dh0) come from bf16-rounded intermediates (as test_simple_gla_kernels).
- **Compiles for a TPU** (:func:`test_compiles_for_tpu_with_cu_seqlens_and_head_dim_64`): libtpu compiles
  each case, packed with K = V = 64, ahead of time for v6e (``harness.compile.tpu_compile.compile_for``, the
  TPU leg's own mechanism): the differentiable function with its jax.vjp, and the ``*_fwd`` and
  ``*_bwd`` entry points, kernels native.

Cost: 25 interpret-mode programs (5 per case), each dominated by XLA:CPU compiling the interpreted
kernels; shapes are as small as the kernels allow (H = 1, T <= 192, one 128-lane tile).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from harness.compile.tpu_compile import compile_for
from kernels_tpu.common import Walk
from kernels_tpu import simple_gla
from kernels_tpu.gla import chunk_gla, chunk_gla_bwd, chunk_gla_fwd
from kernels_tpu.kda import chunk_kda, chunk_kda_bwd, chunk_kda_fwd
from kernels_tpu.simple_gla import chunk_simple_gla, fused_chunk_simple_gla
from kernels_tpu.varlen import ChunkWalk, Packing
from references import gla as ref_gla
from references import kda as ref_kda
from references import simple_gla as ref_simple_gla
from like_the_leg import leg_jit

LENS = (37, 1, 90)  # T = 128; with C = 32 the boundaries 37 and 38 fall inside the chunk [32, 64)
H, C = 1, 32
K = V = 64
F32_TOL = 4 * 2.0**-16
BF16_TOL = 1e-2
SUM_TOL = 1e-6  # a sum whose order differs: float32 rounding, far below any wrong term
SHARED = ("dg_gamma", "dA_log", "ddt_bias")  # per-head parameters: their gradients sum over the sequences


@dataclasses.dataclass(frozen=True)
class Case:
    op: str
    variant: str
    gate: str  # "g" | "g_gamma" | "gate_in_kernel" (kda: A_log, dt_bias, raw g and beta logits)
    dtype: str = "float32"
    final_state: bool = True  # output_final_state and a dht cotangent
    lens: tuple[int, ...] = LENS  # the packed sequences

    def __str__(self):
        return (f"{self.op}-{self.variant}-{self.gate}-{self.dtype}{'-ht' if self.final_state else ''}"
                f"-lens={'+'.join(map(str, self.lens))}")

    @property
    def cu(self) -> tuple[int, ...]:
        return tuple(int(c) for c in np.cumsum((0,) + self.lens))

    @property
    def T(self) -> int:
        return sum(self.lens)

    @property
    def N(self) -> int:
        return len(self.lens)


CASES = [
    Case("simple_gla", "chunk", "g", "bfloat16"),
    Case("simple_gla", "fused_chunk", "g_gamma"),
    Case("gla", "chunk", "g"),
    # with a final state the fused g_gamma path needs sequences of whole chunks (kernels_tpu.gla.api)
    Case("gla", "fused", "g_gamma", lens=(64, 32, 96)),
    Case("kda", "chunk", "gate_in_kernel"),
]
KDA_OPTIONS = dict(use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True)


def draw(case: Case, Kd: int = K, Vd: int = V, seed: int = 0) -> dict:
    """Inputs of one packed row [1, T, H, *] with N states, as numpy arrays (q, k, v, do in the case dtype)."""
    rng = np.random.default_rng(seed)
    T, N = case.T, case.N
    n = lambda *s: rng.standard_normal(s)  # noqa: E731
    dt = ml_dtypes.bfloat16 if case.dtype == "bfloat16" else np.float32
    x = dict(q=n(1, T, H, Kd).astype(dt), k=n(1, T, H, Kd).astype(dt), v=n(1, T, H, Vd).astype(dt),
             do=n(1, T, H, Vd).astype(dt), h0=n(N, H, Kd, Vd).astype(np.float32),
             dht=n(N, H, Kd, Vd).astype(np.float32))
    logsig = lambda *s: (-np.logaddexp(0.0, -n(*s)) / 8).astype(np.float32)  # noqa: E731  log decays
    if case.gate == "g":
        x["g"] = logsig(1, T, H) if case.op == "simple_gla" else logsig(1, T, H, Kd)
    elif case.gate == "g_gamma":
        x["g_gamma"] = np.array([-0.4], np.float32)[:H]
    else:  # kda's raw gate input and beta logits, with the in-kernel gate's parameters
        x.update(g=n(1, T, H, Kd).astype(np.float32), beta=n(1, T, H).astype(np.float32),
                 A_log=n(H).astype(np.float32), dt_bias=n(H * Kd).astype(np.float32))
        for name in ("q", "k"):  # unit keys, as the harness draws them: a well-conditioned delta rule
            x[name] = (x[name] / np.linalg.norm(x[name], axis=-1, keepdims=True)).astype(dt)
    return x


def zero_pad(case: Case, x: dict, Kp: int, Vp: int) -> dict:
    """``x`` explicitly zero-padded to K = Kp, V = Vp (every K- or V-indexed array, at the end)."""
    def pad(a, *axes_to):
        widths = [(0, 0)] * a.ndim
        for axis, to in axes_to:
            widths[axis] = (0, to - a.shape[axis])
        return np.pad(a, widths)

    out = dict(x)
    for name in ("q", "k"):
        out[name] = pad(x[name], (-1, Kp))
    for name in ("v", "do"):
        out[name] = pad(x[name], (-1, Vp))
    for name in ("h0", "dht"):
        out[name] = pad(x[name], (-2, Kp), (-1, Vp))
    if "g" in x and x["g"].ndim == 4:  # a per-channel gate (gla g, kda's raw gate input)
        out["g"] = pad(x["g"], (-1, Kp))
    if "dt_bias" in x:
        out["dt_bias"] = pad(x["dt_bias"].reshape(H, -1), (-1, Kp)).reshape(-1)
    return out


DIFF = ("q", "k", "v", "g", "g_gamma", "beta", "h0", "A_log", "dt_bias")  # what the runs differentiate


def call(case: Case, p: dict, cu_seqlens, scale=None, interpret=True):
    """(o, ht) of the case's differentiable public function on arrays ``p``."""
    kw = dict(scale=scale, initial_state=p["h0"], output_final_state=case.final_state, chunk_size=C,
              interpret=interpret, cu_seqlens=cu_seqlens)
    if case.op == "simple_gla":
        fn = chunk_simple_gla if case.variant == "chunk" else fused_chunk_simple_gla
        return fn(p["q"], p["k"], p["v"], g=p.get("g"), g_gamma=p.get("g_gamma"), **kw)
    if case.op == "gla":
        return chunk_gla(p["q"], p["k"], p["v"], g=p.get("g"), g_gamma=p.get("g_gamma"), path=case.variant, **kw)
    return chunk_kda(p["q"], p["k"], p["v"], p["g"], p["beta"], A_log=p["A_log"], dt_bias=p["dt_bias"],
                     **KDA_OPTIONS, **kw)


def run(case: Case, x: dict, cu_seqlens=None, scale=None) -> dict:
    """o, ht and every gradient (``d<name>``) of ``sum(o*do) + sum(ht*dht)``, as float32 numpy arrays."""
    primals = {n: jnp.asarray(x[n]) for n in DIFF if n in x}
    dht = jnp.asarray(x["dht"]) if case.final_state else None

    @leg_jit
    def go(p, do, dht):
        (o, ht), vjp = jax.vjp(lambda p: call(case, p, cu_seqlens, scale), p)
        (grads,) = vjp((do, dht))
        return o, ht, grads

    o, ht, grads = go(primals, jnp.asarray(x["do"]), dht)
    assert o.dtype == x["q"].dtype and all(grads[n].dtype == x[n].dtype for n in grads)
    out = {"o": o, "ht": ht, **{"d" + n: a for n, a in grads.items()}}
    return {n: np.asarray(jnp.asarray(a, jnp.float32)) for n, a in out.items() if a is not None}


@functools.cache
def packed(case: Case) -> dict:
    """The packed K = V = 64 run (shared by the tests below)."""
    return run(case, draw(case), cu_seqlens=case.cu)


@functools.cache
def separate(case: Case, i: int) -> dict:
    """Sequence i alone: B = 1, T = lens[i], its own initial state and dht."""
    x = draw(case)
    sl = slice(case.cu[i], case.cu[i + 1])
    part = {n: (a[:, sl] if a.ndim >= 3 and a.shape[:2] == (1, case.T) else a) for n, a in x.items()}
    part["h0"], part["dht"] = x["h0"][i:i + 1], x["dht"][i:i + 1]
    return run(case, part)


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


# ------------------------------------------------------------------ lane padding
@pytest.mark.parametrize("case", CASES, ids=str)
def test_head_dim_64_equals_explicit_zero_padding_to_128(case):
    got = packed(case)
    wide = run(case, zero_pad(case, draw(case), 128, 128), cu_seqlens=case.cu, scale=K ** -0.5)
    assert got["o"].shape == (1, case.T, H, V) and got["dq"].shape == (1, case.T, H, K)
    assert set(got) == set(wide)
    for name, a in got.items():
        b = wide[name]
        if name in ("ht", "dh0"):
            b = b[..., :K, :V]
        elif name == "ddt_bias":
            b = b.reshape(H, 128)[:, :K].reshape(-1)
        elif name in ("o", "dv"):
            b = b[..., :V]
        elif name in ("dq", "dk") or (name == "dg" and b.ndim == 4):
            b = b[..., :K]
        assert a.shape == b.shape, name
        if name == "dA_log":
            assert rel(a, b) <= SUM_TOL, (name, rel(a, b))
        else:
            np.testing.assert_array_equal(a, b, err_msg=f"{case} {name}")


# ------------------------------------------------------------------ packed sequences
@pytest.mark.parametrize("case", CASES, ids=str)
def test_packed_equals_separate_sequences(case):
    got = packed(case)
    parts = [separate(case, i) for i in range(case.N)]
    assert set(got) == set(parts[0])
    for name, a in got.items():
        if name in SHARED:
            want = np.sum([p[name] for p in parts], axis=0)
            assert rel(a, want) <= SUM_TOL, (name, rel(a, want))
            continue
        axis = 0 if name in ("ht", "dh0") else 1
        want = np.concatenate([p[name] for p in parts], axis=axis)
        np.testing.assert_array_equal(a, want, err_msg=f"{case} {name}")


# an empty sequence between others, and one at the end; gla's fused g_gamma path with whole chunks
EMPTY_CASES = [Case("simple_gla", "chunk", "g_gamma", lens=(32, 0, 64, 0)),
               Case("simple_gla", "fused_chunk", "g", lens=(0, 37, 0, 91)),
               Case("gla", "fused", "g_gamma", lens=(32, 0, 64, 0)),
               Case("gla", "chunk", "g", lens=(0, 37, 0, 91)),
               Case("kda", "chunk", "gate_in_kernel", lens=(0, 37, 0, 91))]


@pytest.mark.parametrize("case", EMPTY_CASES, ids=str)
def test_empty_sequences_pass_their_state_through(case):
    """An empty sequence (fla's tests pack ``[0, 0, 16]``) takes one chunk of identity tokens in the walk:
    its ht is its h0 and its dh0 its dht, exactly, and the others equal their separate runs bit for bit."""
    got, x = packed(case), draw(case)
    empty = [i for i, n in enumerate(case.lens) if n == 0]
    np.testing.assert_array_equal(got["ht"][empty], x["h0"][empty])
    np.testing.assert_array_equal(got["dh0"][empty], x["dht"][empty])
    for i in (i for i, n in enumerate(case.lens) if n):
        one, sl = separate(case, i), slice(case.cu[i], case.cu[i + 1])
        np.testing.assert_array_equal(got["o"][:, sl], one["o"], err_msg=f"{case} o of sequence {i}")
        np.testing.assert_array_equal(got["ht"][i], one["ht"][0], err_msg=f"{case} ht of sequence {i}")
        np.testing.assert_array_equal(got["dh0"][i], one["dh0"][0], err_msg=f"{case} dh0 of sequence {i}")


def reference(case: Case, x: dict) -> dict:
    """float64 reference with the same cu_seqlens: o, ht and the gradients."""
    x64 = {n: np.asarray(a, np.float64) for n, a in x.items()}
    common = dict(initial_state=x64["h0"], cu_seqlens=case.cu, chunk_size=C)
    dht = x64["dht"] if case.final_state else None
    if case.op == "kda":
        kw = dict(A_log=x64["A_log"], dt_bias=x64["dt_bias"], **KDA_OPTIONS, **common)
        o, ht = ref_kda.chunk_kda(x64["q"], x64["k"], x64["v"], x64["g"], x64["beta"], output_final_state=True, **kw)
        grads = ref_kda.chunk_kda_bwd(x64["q"], x64["k"], x64["v"], x64["g"], x64["beta"], x64["do"], dht, **kw)
    else:
        ref = ref_simple_gla if case.op == "simple_gla" else ref_gla
        fwd, bwd = ((ref.chunk_simple_gla, ref.chunk_simple_gla_bwd) if case.op == "simple_gla"
                    else (ref.chunk_gla, ref.chunk_gla_bwd))
        gate = {n: x64[n] for n in ("g", "g_gamma") if n in x64}
        o, ht = fwd(x64["q"], x64["k"], x64["v"], **gate, output_final_state=True, **common)
        grads = bwd(x64["q"], x64["k"], x64["v"], x64["do"], dht, **gate, **common)
    return {"o": o, "ht": ht, **{n: a for n, a in grads.items() if a is not None}}


# one case per op: every variant is already bit-exact to its kernels at K = 128 (above), which the
# per-op kernel tests hold to the reference
REFERENCE_CASES = [CASES[0], CASES[2], CASES[4]]


@pytest.mark.parametrize("case", REFERENCE_CASES, ids=str)
def test_against_float64_reference(case):
    got = packed(case)
    want = reference(case, draw(case))
    tol = BF16_TOL if case.dtype == "bfloat16" else F32_TOL
    errors = {n: rel(a, want[n]) for n, a in got.items()}
    print(case, {n: f"{e:.1e}" for n, e in errors.items()})
    bad = {n: e for n, e in errors.items() if not e <= tol}
    assert not bad, bad


# ------------------------------------------------------------------ shapes and refusals
def test_padding_overhead():
    """Tokens processed over real tokens (chunk size 64) of the packings quoted in kernels_tpu.varlen: the
    chunk walk's (ChunkWalk, sum_i ceil(len_i / C) * C / T), beside the padded batch rows it replaced
    (N * L_pad / T, L_pad the longest sequence rounded up to a chunk)."""
    def ratios(lens):
        q = jax.ShapeDtypeStruct((1, sum(lens), 1, 128), jnp.float32)
        walk = ChunkWalk(Packing.of(np.cumsum((0,) + lens), q), 64)
        rows = len(lens) * -(-max(lens) // 64) * 64 / sum(lens)
        assert walk.rows * walk.row_length == sum(-(-n // 64) * 64 for n in lens)
        return round(rows, 2), round(walk.work_ratio(), 3)

    assert ratios((37, 128, 91)) == (1.50, 1.25)  # 320 / 256
    assert ratios((1024,) * 8) == (1.00, 1.00)
    assert ratios((3000, 1500, 1200, 900, 700, 500, 300, 92)) == (2.94, 1.023)  # 8384 / 8192
    assert ratios((8185,) + (1,) * 7) == (8.00, 1.055)  # (8192 + 7 * 64) / 8192 = 1.0547
    assert ratios((2048, 1031, 517, 1500, 64, 1777, 999, 256)) == (2.00, 1.023)  # the stress packing
    # gla's fused g_gamma path with a final state needs sequences of whole chunks (rows padded by whole chunks)
    q = jax.ShapeDtypeStruct((1, 192, 1, 64), jnp.float32)
    assert not Packing.of((0, 64, 96, 192), q).ends_inside_a_chunk(32)
    assert Packing.of((0, 37, 38, 192), q).ends_inside_a_chunk(32)


def test_chunk_walk_on_hand_computed_tables():
    """Lengths (37, 128, 91) at C = 64: sequences take 1, 2 and 2 chunks of one row; an unpacked batch of
    two rows of T = 100 takes 2 chunks each."""
    q = jax.ShapeDtypeStruct((1, 256, 1, 128), jnp.float32)
    walk = ChunkWalk(Packing.of((0, 37, 165, 256), q), 64)
    F, L = ChunkWalk.FIRST, ChunkWalk.LAST
    assert (walk.rows, walk.NT, walk.row_length) == (1, 5, 320)
    slot, edge = walk.tables()
    assert slot.tolist() == [0, 1, 1, 2, 2] and edge.tolist() == [F | L, F, L, F, L]
    assert walk.real_tokens().tolist() == [37, 64, 64, 64, 27]
    # the maps: sequence 1 (tokens 37..164) starts at chunk 1 (position 64), sequence 2 at chunk 3 (192)
    x = jnp.arange(1, 257, dtype=jnp.float32)[None, :, None]
    rows = walk.to_rows(x)[0, :, 0]
    assert rows[:37].tolist() == list(range(1, 38)) and not rows[37:64].any()
    assert rows[64:192].tolist() == list(range(38, 166)) and rows[192:283].tolist() == list(range(166, 257))
    assert not rows[283:].any()
    np.testing.assert_array_equal(walk.to_tokens(walk.to_rows(x)), x)
    batch = ChunkWalk(Packing.of(None, jax.ShapeDtypeStruct((2, 100, 1, 128), jnp.float32)), 64)
    slot, edge = batch.tables()
    assert (batch.rows, batch.NT) == (2, 2) and slot.tolist() == [0, 0, 1, 1] and edge.tolist() == [F, L, F, L]
    assert batch.real_tokens().tolist() == [64, 36, 64, 36]
    y = jnp.ones((2, 100, 3))
    assert batch.to_rows(y).shape == (2, 128, 3) and batch.to_tokens(batch.to_rows(y)).shape == (2, 100, 3)


def test_walk_index_maps_on_hand_computed_grids():
    """kernels_tpu.common.Walk: grid step t visits block t forward, NT/steps - 1 - t in reverse, and the state
    block of the sequence its first chunk belongs to (slot table of the (37, 128, 91) packing at C = 64)."""
    slot = np.array([0, 1, 1, 2, 2])
    forward, reverse = Walk(5), Walk(5, reverse=True)
    assert [forward.chunk_map(0, 3, t, slot, None) for t in (0, 4)] == [(0, 3, 0, 0), (0, 3, 4, 0)]
    assert [reverse.chunk_map(0, 3, t, slot, None) for t in (0, 4)] == [(0, 3, 4, 0), (0, 3, 0, 0)]
    assert [forward.slot_map(0, 3, t, slot, None)[0] for t in range(5)] == [0, 1, 1, 2, 2]
    assert [reverse.slot_map(0, 3, t, slot, None)[0] for t in range(5)] == [2, 2, 1, 1, 0]
    # two chunks per step, unpacked rows of 4 chunks: row 1's steps start at chunks 4 and 6
    rows = np.repeat([0, 1], 4)
    two = Walk(4, steps=2)
    assert [two.slot_map(1, 0, t, rows, None)[0] for t in (0, 1)] == [1, 1]
    assert two.chunk_states_map(1, 0, 1) == (1, 0, 1, 0, 0)  # the block of chunks 2..3 of row 1


def test_cu_seqlens_checks_are_the_contracts():
    """Bad offsets are the op contract's ValueError (the references' message); traced offsets, which
    would have to fix the kernels' shapes, are a NotImplementedError."""
    case = CASES[1]
    x = draw(case)
    q, k, v = (jnp.asarray(x[n]) for n in "qkv")
    T, CU = case.T, case.cu
    with pytest.raises(ValueError, match="must end at T=128"):
        chunk_simple_gla(q, k, v, g_gamma=x["g_gamma"], cu_seqlens=(0, 37, 100), interpret=True)
    with pytest.raises(ValueError, match=r"initial_state must be \[N,H,K,V\]"):
        chunk_gla(q, k, v, g_gamma=x["g_gamma"], initial_state=x["h0"][:2], cu_seqlens=CU, interpret=True)
    with pytest.raises(ValueError, match="B must be 1"):
        chunk_kda(*(jnp.concatenate([a, a]) for a in (q, k, v)), jnp.zeros((2, T, H, K)), jnp.zeros((2, T, H)),
                  cu_seqlens=CU, interpret=True)
    with pytest.raises(NotImplementedError, match="static"):
        jax.jit(lambda cu: chunk_simple_gla(q, k, v, cu_seqlens=cu, interpret=True))(jnp.asarray(CU))
    # a sequence ending inside a chunk: the fused g_gamma path is exact only without a final state
    with pytest.raises(NotImplementedError, match="path='chunk'"):
        chunk_gla(q, k, v, g_gamma=x["g_gamma"], output_final_state=True, cu_seqlens=CU, path="fused",
                  interpret=True)


# ------------------------------------------------------------------ compiled for real TPUs
def vjp_program(case: Case):
    """The differentiable function and its jax.vjp, kernels native: what the TPU leg compiles."""
    def fn(x):
        primals = {n: x[n] for n in DIFF if n in x}
        (o, ht), vjp = jax.vjp(lambda p: call(case, {**x, **p}, case.cu, interpret=None), primals)
        return o, ht, vjp((x["do"], x["dht"] if case.final_state else None))
    return fn


def entry_points_program(case: Case):
    """The forward-only and backward-only public functions (``*_fwd``, ``*_bwd``), kernels native."""
    def fn(x):
        h0, dht = x["h0"], (x["dht"] if case.final_state else None)
        kw = dict(initial_state=h0, chunk_size=C, cu_seqlens=case.cu)
        if case.op == "simple_gla":
            fwd, bwd = ((simple_gla.chunk_simple_gla_fwd, simple_gla.chunk_simple_gla_bwd) if case.variant == "chunk"
                        else (simple_gla.fused_chunk_simple_gla_fwd, simple_gla.fused_chunk_simple_gla_bwd))
            gate = dict(g=x.get("g"), g_gamma=x.get("g_gamma"))
            return (fwd(x["q"], x["k"], x["v"], **gate, output_final_state=case.final_state, **kw),
                    bwd(x["q"], x["k"], x["v"], x["do"], **gate, dht=dht, **kw))
        if case.op == "gla":
            gate = dict(g=x.get("g"), g_gamma=x.get("g_gamma"), path=case.variant)
            return (chunk_gla_fwd(x["q"], x["k"], x["v"], **gate, output_final_state=case.final_state, **kw),
                    chunk_gla_bwd(x["q"], x["k"], x["v"], x["do"], dht, **gate, **kw))
        kda_kw = dict(A_log=x["A_log"], dt_bias=x["dt_bias"], **KDA_OPTIONS, **kw)
        return (chunk_kda_fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], output_final_state=case.final_state,
                              **kda_kw),
                chunk_kda_bwd(x["q"], x["k"], x["v"], x["g"], x["beta"], x["do"], dht, **kda_kw))
    return fn


COMPILE_TARGET = "v6e"


@pytest.mark.parametrize("case", CASES, ids=str)
def test_compiles_for_tpu_with_cu_seqlens_and_head_dim_64(case):
    """libtpu's Mosaic and XLA:TPU compile the forward and backward, packed (cu_seqlens) with K = V = 64,
    ahead of time for a TPU topology (harness.compile.tpu_compile, the TPU leg's own mechanism)."""
    x = draw(case)
    for program in (vjp_program, entry_points_program):
        result = compile_for(program(case), (x,), COMPILE_TARGET)
        print(case, program.__name__, result.status, f"{result.seconds:.1f}s", result.hbm_bytes)
        assert result.ok, (program.__name__, result.error)
