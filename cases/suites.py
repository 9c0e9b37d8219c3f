"""Named suites: lists of cases, chosen for what each tier must prove.

- ``smoke``: every leg in CPU emulation within a few minutes. Interpreters are
  slow (fla simple_gla bf16 at B1 T256 H2 K=V=128 takes ~3.5 s forward and
  ~8 s backward in the Triton interpreter), so shapes are minimal while still
  covering both gate kinds, h0, dht, every dtype, chunk 64 and 128, both
  variants, K = V = 64 (below the 128-lane width: the TPU kernels pad it), and per op one case of packed
  variable-length sequences (``lens``, fla's ``cu_seqlens``) whose boundaries
  fall inside chunks, one sequence spanning two of its own chunks; for gdn and kda one case with grouped
  value heads (``HV`` > H), and for gdn a decode step (one- and three-token sequences from carried states)
  packed beside a prefill, and gdn served (``harness.ops.serving``: a state pool, zero-length requests, decode
  steps after the prefill).
- ``regressions``: cases reproducing known failure classes (see each entry);
  packed sequences at their edges: a one-token sequence, boundaries one token
  before and one after a chunk edge, sequences of C - 1 and C + 1 tokens, h0
  and dht per sequence; and every op, variant, gate kind and kernel path packing each chunk edge
  (:data:`EDGE_LENS`: one token, C - 1, C, C + 1, a multiple of C next to a longer sequence).
  fla's own tests' gate strengths (normalizers 0.1 and 10: strong and weak decay) per op and dtype.
  Serving (``harness.ops.serving``): a pooled state buffer, decode steps after a prefill, and requests of
  length 0 beside long ones under every gate form, on every op's chunk paths (smoke holds gdn's); the same
  with a bf16 and an fp16 state cache (``state_dtype``: :func:`state_cache_cases`).
  An empty sequence's final state (h0, ht, dht), pooled and read from another slot, on every kernel path under
  every gate form (:func:`empty_state_cases`; the rule: tests/test_empty_sequence_coverage.py).
- ``standard``: a broader grid for pre-merge runs on hardware, with one packing of four sequences per op
  and gate kind, and fla's test row that found fp16 under strong decay (T = 1000, H = 4) per op.
- ``stress``: long sequences, H=16, ALiBi from layer 0 of 20-32 layers: the
  exp-overflow regime (|gamma| * 128 = 90.5 > 88.7 = log(float32 max)); a training-like packing of eight
  sequences summing to 8192 per op.
- ``production``: one training step at the shapes the peers' models train with (:func:`production_cases`).
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

from .case import Case, Gate
from .user_like import user_like_cases

G = Gate("g", "logsigmoid", normalizer=16)

SMOKE_LENS = (37, 70, 21)
"""The smoke suite's packed sequences (T = 128, C = 64): boundaries at 37 and 107, inside chunks; the middle
sequence spans two chunks of its own (64 + 6 tokens); three sequences, so one isolation run checks both
directions (harness.probes.causality)."""


STANDARD_LENS = (300, 129, 500, 71)
"""A pre-merge packing: four sequences summing to T = 1000, boundaries at no chunk multiple."""

STRESS_LENS = (2048, 1031, 517, 1500, 64, 1777, 999, 256)
"""A training-like packing: eight sequences summing to T = 8192, from one chunk to 2048 tokens."""


GATE_STRENGTHS = (0.1, 10.0)
"""The gate normalizers fla's tests use besides 16: ``logsigmoid(x) / 0.1`` is a strong decay (about
-7 per token: a state is little more than its last token's outer product), ``/ 10`` a weak one."""


def gate_strength(normalizer: float, lower_bound: float | None = None) -> Gate:
    return Gate("g", "logsigmoid", normalizer=normalizer, lower_bound=lower_bound)


def gate_strength_cases(op: str, dtypes=("bfloat16", "float16", "float32"), *, lower_bound: float | None = None,
                        **shape) -> list[Case]:
    """One case per dtype and strength of :data:`GATE_STRENGTHS` (``lower_bound`` clamps the strong gate only)."""
    shape = {"variant": "chunk", "B": 1, "T": 128, "H": 1, "K": 128, "V": 128, "chunk_size": 64, "h0": True,
             "dht": True, **shape}
    return [Case(op, dtype=dtype, gate=gate_strength(norm, lower_bound if norm < 1 else None), **shape)
            for dtype in dtypes for norm in GATE_STRENGTHS]


def alibi(num_layers: int = 32, layer_idx: int = 0) -> Gate:
    return Gate("g_gamma", "alibi", num_layers=num_layers, layer_idx=layer_idx)


def _simple_gla_smoke() -> list[Case]:
    base = dict(op="simple_gla", B=1, H=2, K=128, V=128)
    return [
        Case(variant="chunk", T=128, dtype="bfloat16", gate=G, chunk_size=64, h0=True, dht=True, **base),
        Case(variant="chunk", T=256, dtype="bfloat16", gate=alibi(), chunk_size=128, h0=True, **base),
        Case(variant="chunk", T=128, dtype="float32", gate=G, chunk_size=64, dht=True, **base),
        Case(variant="chunk", T=128, dtype="float16", gate=alibi(), chunk_size=64, h0=True, dht=True, **base),
        Case(variant="fused_chunk", T=128, dtype="bfloat16", gate=G, chunk_size=64, h0=True, dht=True, **base),
        Case(variant="fused_chunk", T=128, dtype="float32", gate=alibi(), chunk_size=64, **base),
        # K=V=64, fla's own test shape: below the 128-lane width, the TPU kernels pad K and V exactly
        Case(op="simple_gla", variant="chunk", B=1, T=64, H=2, K=64, V=64, dtype="bfloat16", gate=G, chunk_size=64),
        # a partial last chunk per gate kind (T = 100 = 64 + 36): the kernels pad time; the padding must not decay
        # the state nor reach any gradient
        Case(variant="chunk", T=100, dtype="bfloat16", gate=G, chunk_size=64, h0=True, dht=True, **{**base, "H": 1}),
        Case(variant="chunk", T=100, dtype="bfloat16", gate=alibi(), chunk_size=64, h0=True, dht=True,
             **{**base, "H": 1}),
        # packed sequences: boundaries inside chunks (37, 107), the middle one two chunks of its own (64 + 6)
        Case(variant="chunk", T=sum(SMOKE_LENS), dtype="bfloat16", gate=G, chunk_size=64, h0=True, dht=True,
             lens=SMOKE_LENS, **{**base, "H": 1}),
    ]


def _simple_gla_regressions() -> list[Case]:
    return [
        # NaN at chunk_size=128 with ALiBi g_gamma: H=16 reaches slope 2^-0.5, |gamma|*128 = 90.5 > 88.7
        Case("simple_gla", "chunk", B=1, T=256, H=16, K=128, V=128, dtype="bfloat16", gate=alibi(32, 0),
             chunk_size=128, h0=True, dht=True),
        Case("simple_gla", "fused_chunk", B=1, T=256, H=16, K=128, V=128, dtype="bfloat16", gate=alibi(32, 0),
             chunk_size=128),
        # a non-zero dht must reach dg (and dh0) through the reverse-time state gradient
        Case("simple_gla", "chunk", B=1, T=256, H=2, K=128, V=128, dtype="float32", gate=G, chunk_size=64,
             h0=True, dht=True),
        # packed: sequences of C - 1, 2, 1 and C + 1 tokens, boundaries one token before (63) and one after (65)
        # a chunk edge, a state and a state gradient per sequence; chunked and fused kernels (a per-token gate:
        # a g_gamma gradient sums over the sequences, whose parts can cancel to ill-conditioning in bf16)
        Case("simple_gla", "chunk", B=1, T=131, H=1, K=128, V=128, dtype="float32", gate=G, chunk_size=64,
             h0=True, dht=True, lens=(63, 2, 1, 65)),
        Case("simple_gla", "fused_chunk", B=1, T=131, H=1, K=128, V=128, dtype="bfloat16", gate=G, chunk_size=64,
             h0=True, dht=True, lens=(63, 2, 1, 65)),
        # fla's gate strengths: under a strong decay ht is about k_T v_T^T, which fla multiplies exactly in fp16
        # (a 3-pass bf16 split lost its lo*lo term: 2.5x fla's ht error)
        *gate_strength_cases("simple_gla"),
    ]


def _simple_gla_standard() -> list[Case]:
    out = []
    for variant, dtype, gate, C, T in itertools.product(
        ("chunk", "fused_chunk"), ("bfloat16", "float16", "float32"), (G, alibi(24, 0), alibi(24, 12)),
        (64, 128), (512, 1000),
    ):
        out.append(Case("simple_gla", variant, B=2, T=T, H=4, K=128, V=128, dtype=dtype, gate=gate,
                        chunk_size=C, h0=True, dht=True))
    out += gate_strength_cases("simple_gla", ("float16",), T=1000, H=4, dht=True, scale=1.0)
    for variant, gate in (("chunk", G), ("fused_chunk", G), ("chunk", alibi(24, 0))):
        out.append(Case("simple_gla", variant, B=1, T=sum(STANDARD_LENS), H=4, K=128, V=128, dtype="bfloat16",
                        gate=gate, chunk_size=64, h0=True, dht=True, lens=STANDARD_LENS))
    return out


def _simple_gla_stress() -> list[Case]:
    out = []
    for T, L in ((2048, 20), (4096, 24), (8192, 32)):
        for variant in ("chunk", "fused_chunk"):
            out.append(Case("simple_gla", variant, B=1, T=T, H=16, K=128, V=128, dtype="bfloat16",
                            gate=alibi(L, 0), chunk_size=128, h0=True, dht=True))
    out.append(Case("simple_gla", "chunk", B=2, T=4096, H=16, K=128, V=128, dtype="bfloat16",
                    gate=alibi(32, 0), chunk_size=128, h0=True, dht=True))
    for variant in ("chunk", "fused_chunk"):
        out.append(Case("simple_gla", variant, B=1, T=sum(STRESS_LENS), H=16, K=128, V=128, dtype="bfloat16",
                        gate=alibi(32, 0), chunk_size=64, h0=True, dht=True, lens=STRESS_LENS))
    return out


def _gla_smoke() -> list[Case]:
    base = dict(op="gla", variant="chunk", B=1, H=2, chunk_size=64)
    return [
        Case(T=128, K=128, V=128, dtype="bfloat16", gate=G, h0=True, dht=True, **base),
        # the fused g_gamma path with two V tiles: tiles must not overwrite each other
        Case(T=128, K=128, V=256, dtype="bfloat16", gate=alibi(), h0=True, dht=True, **base),
        # K = 256: the reduction over K tiles for o
        Case(T=64, K=256, V=128, dtype="float32", gate=G, dht=True, **base),
        # packed sequences: boundaries inside chunks, the middle one two chunks of its own
        Case(T=sum(SMOKE_LENS), K=128, V=128, dtype="bfloat16", gate=G, h0=True, dht=True, lens=SMOKE_LENS,
             **{**base, "H": 1}),
        # K = V = 64 (padded to the lane width inside the kernels) with a partial last chunk (T = 64 + 36)
        Case(T=100, K=64, V=64, dtype="bfloat16", gate=G, h0=True, dht=True, **{**base, "H": 1}),
        # the fused g_gamma path with a partial last chunk
        Case(T=100, K=128, V=128, dtype="bfloat16", gate=alibi(), h0=True, dht=True, **{**base, "H": 1}),
    ]


def _gla_regressions() -> list[Case]:
    return [
        # the fused g_gamma backward once returned zeros for the gate gradient; at H=16, layer 0,
        # C=128 the decay is steepest (fla cannot run C=128: bounds-only there)
        Case("gla", "chunk", B=1, T=256, H=16, K=128, V=128, dtype="bfloat16", gate=alibi(32, 0),
             chunk_size=128, h0=True, dht=True),
        # K and V both 256 with a fused g_gamma path: the K-tile reduction and V tiles together
        Case("gla", "chunk", B=1, T=128, H=2, K=256, V=256, dtype="bfloat16", gate=alibi(24, 0), chunk_size=64,
             h0=True, dht=True),
        # the same g_gamma case forced through the per-channel kernels: both TPU paths agree with fla
        Case("gla", "chunk", B=1, T=128, H=2, K=128, V=128, dtype="float32", gate=alibi(24, 0), chunk_size=64,
             h0=True, dht=True, options=(("tpu_path", "chunk"),)),
        # a non-zero dht feeding the per-channel dg
        Case("gla", "chunk", B=1, T=192, H=2, K=128, V=128, dtype="bfloat16", gate=G, chunk_size=64, h0=True,
             dht=True),
        # packed with a g_gamma gate (fla: broadcast to a per-channel g): a one-token sequence first, then
        # sequences of C - 1 and C + 1 tokens, boundaries on a chunk edge (64) and one token after one (129)
        Case("gla", "chunk", B=1, T=129, H=1, K=128, V=128, dtype="bfloat16", gate=alibi(24, 0), chunk_size=64,
             h0=True, dht=True, lens=(1, 63, 65)),
        # fla's gate strengths, per channel
        *gate_strength_cases("gla"),
    ]


def _gla_standard() -> list[Case]:
    grid = [Case("gla", "chunk", B=2, T=T, H=4, K=K, V=128, dtype=dtype, gate=gate, chunk_size=64, h0=True, dht=True)
            for dtype, gate, T, K in itertools.product(("bfloat16", "float16", "float32"), (G, alibi(24, 0)),
                                                        (512, 1000), (128, 256))]
    packed = [Case("gla", "chunk", B=1, T=sum(STANDARD_LENS), H=4, K=128, V=128, dtype="bfloat16", gate=gate,
                   chunk_size=64, h0=True, dht=True, lens=STANDARD_LENS) for gate in (G, alibi(24, 0))]
    return grid + packed + gate_strength_cases("gla", ("float16",), T=1000, H=4)


def _gla_stress() -> list[Case]:
    return [Case("gla", "chunk", B=1, T=T, H=16, K=128, V=128, dtype="bfloat16", gate=alibi(L, 0), chunk_size=C,
                 h0=True, dht=True) for T, L, C in ((2048, 20, 64), (8192, 32, 128))] + [
        Case("gla", "chunk", B=1, T=sum(STRESS_LENS), H=16, K=128, V=128, dtype="bfloat16", gate=G, chunk_size=64,
             h0=True, dht=True, lens=STRESS_LENS)]


def _kda_smoke() -> list[Case]:
    base = dict(op="kda", variant="chunk", B=1, K=128, V=128, chunk_size=64)
    return [
        # q/k normalised and beta squashed in the op, the realistic gate bounded at -5
        Case(T=128, H=2, dtype="bfloat16", gate=Gate("g", normalizer=16, lower_bound=-5.0), h0=True, dht=True,
             options=(("use_qk_l2norm_in_kernel", True), ("use_beta_sigmoid_in_kernel", True)), **base),
        # pre-normalised q/k, beta = sigmoid(N(0,1)) outside the op
        Case(T=64, H=2, dtype="float32", gate=G, dht=True, **base),
        # the gate computed in the op from A_log / dt_bias with fla's lower_bound
        Case(T=64, H=1, dtype="bfloat16", gate=G, h0=True,
             options=(("use_gate_in_kernel", True), ("lower_bound", -5.0)), **base),
        # packed sequences: boundaries inside chunks, the middle one two chunks of its own
        Case(T=sum(SMOKE_LENS), H=1, dtype="bfloat16", gate=Gate("g", normalizer=16, lower_bound=-5.0), h0=True,
             dht=True, lens=SMOKE_LENS,
             options=(("use_qk_l2norm_in_kernel", True), ("use_beta_sigmoid_in_kernel", True)), **base),
        # K = V = 64 (padded to the lane width inside the kernels) with a partial last chunk (T = 64 + 36)
        Case(T=100, H=1, dtype="bfloat16", gate=Gate("g", normalizer=16, lower_bound=-5.0), h0=True, dht=True,
             options=(("use_qk_l2norm_in_kernel", True), ("use_beta_sigmoid_in_kernel", True)),
             **{**base, "K": 64, "V": 64}),
    ]


def _kda_regressions() -> list[Case]:
    return [
        # extreme gates: logsigmoid(N)/0.1 reaches -30 per token, clamped at -5 (safe-gate regime)
        Case("kda", "chunk", B=1, T=192, H=2, K=128, V=128, dtype="bfloat16",
             gate=Gate("g", normalizer=0.1, lower_bound=-5.0), chunk_size=64, h0=True, dht=True),
        # fla's safe-gate path (bf16x3 dots, gather) with the in-op gate bounded at -5
        Case("kda", "chunk", B=1, T=64, H=1, K=128, V=128, dtype="bfloat16", gate=G, chunk_size=64, h0=True,
             options=(("use_gate_in_kernel", True), ("lower_bound", -5.0), ("safe_gate", True))),
        # several chunks with a non-zero dht: the WY backward across chunk boundaries
        Case("kda", "chunk", B=2, T=256, H=2, K=128, V=128, dtype="float32", gate=G, chunk_size=64, h0=True,
             dht=True, options=(("use_qk_l2norm_in_kernel", True),)),
        # fp16 never reaches a Mosaic kernel (it can neither load nor store it): widened to f32 at the boundary
        Case("kda", "chunk", B=1, T=128, H=2, K=128, V=128, dtype="float16", gate=G, chunk_size=64, h0=True,
             dht=True),
        # packed: a sequence of C + 1 tokens, a one-token sequence right after it (boundaries one token after a
        # chunk edge: 65, 66), then C - 2 tokens; a state and a state gradient per sequence
        Case("kda", "chunk", B=1, T=128, H=1, K=128, V=128, dtype="float32", gate=G, chunk_size=64, h0=True,
             dht=True, lens=(65, 1, 62)),
        # fla's gate strengths; the strong gate clamped at -5 as fla's safe gate needs (bf16 is the case above)
        *gate_strength_cases("kda", ("float16", "float32"), lower_bound=-5.0),
        *gate_strength_cases("kda", ("bfloat16",))[1:],
    ]


def _kda_standard() -> list[Case]:
    out = []
    for dtype, opts in itertools.product(("bfloat16", "float32"), (
            (), (("use_qk_l2norm_in_kernel", True), ("use_beta_sigmoid_in_kernel", True)),
            (("use_gate_in_kernel", True), ("lower_bound", -5.0)),
            (("use_gate_in_kernel", True), ("lower_bound", -5.0), ("safe_gate", True)))):
        out.append(Case("kda", "chunk", B=2, T=512, H=4, K=128, V=128, dtype=dtype, gate=G, chunk_size=64,
                        h0=True, dht=True, options=opts))
    out.append(Case("kda", "chunk", B=1, T=sum(STANDARD_LENS), H=4, K=128, V=128, dtype="bfloat16", gate=G,
                    chunk_size=64, h0=True, dht=True, lens=STANDARD_LENS, options=(("use_qk_l2norm_in_kernel", True),)))
    return out + gate_strength_cases("kda", ("float16",), T=1000, H=4, lower_bound=-5.0)


def _kda_stress() -> list[Case]:
    return [Case("kda", "chunk", B=1, T=T, H=16, K=128, V=128, dtype="bfloat16", gate=G, chunk_size=64, h0=True,
                 dht=True, options=(("use_qk_l2norm_in_kernel", True),)) for T in (2048, 8192)] + [
        Case("kda", "chunk", B=1, T=sum(STRESS_LENS), H=16, K=128, V=128, dtype="bfloat16", gate=G, chunk_size=64,
             h0=True, dht=True, lens=STRESS_LENS, options=(("use_qk_l2norm_in_kernel", True),))]


EDGE_LENS = (1, 63, 64, 65)
"""Every chunk edge at C = 64 in one packing (T = 193): a one-token sequence, then C - 1, C and C + 1 tokens,
the exact multiple of C next to a longer sequence (the coverage rule, tests/test_suite_coverage.py)."""


def packing_edge_cases() -> list[Case]:
    """:data:`EDGE_LENS` on each op's variant, gate kind and kernel path whose packed cases missed an edge: the
    dtypes rotate; gla's fused g_gamma kernels take a ragged packing only without ht (with it, the chunk kernels
    run it: the ``h0, dht`` case)."""
    base = dict(B=1, T=sum(EDGE_LENS), H=1, K=128, V=128, chunk_size=64, lens=EDGE_LENS)
    state = dict(h0=True, dht=True)
    return [
        Case("simple_gla", "chunk", dtype="float16", gate=G, **state, **base),
        # fp32: dg_gamma sums dg over the four sequences, and at bf16 draw 0 cancels 100-fold (sum |dg_t| / |dg_gamma|
        # = 102), so the TPU's bf16-level error in the terms (1.7e-3 of their scale) reads as rel_l2 0.17 > the bf16
        # bound; draws 1 and 2 (condition 2) give 1.9e-3 and 5.6e-4. fla returns no dg_gamma to compare with.
        Case("simple_gla", "chunk", dtype="float32", gate=alibi(8, 0), **state, **base),
        Case("simple_gla", "fused_chunk", dtype="float32", gate=G, **state, **base),
        Case("simple_gla", "fused_chunk", dtype="bfloat16", gate=alibi(8, 0), **state, **base),
        Case("gla", "chunk", dtype="float16", gate=G, **state, **base),
        Case("gla", "chunk", dtype="bfloat16", gate=alibi(8, 0), **state, **base),
        Case("gla", "chunk", dtype="float32", gate=alibi(8, 0), h0=True, final_state=False, **base),
        Case("kda", "chunk", dtype="bfloat16", gate=Gate("g", normalizer=16, lower_bound=-5.0), **state,
             options=(("use_qk_l2norm_in_kernel", True),), **base),
    ]


DECODE = "fused_recurrent"
"""The decode variant of kda and gdn (fla's fused_recurrent kernels; forward only)."""

DECODE_LENS = (1, 1, 3, 59)
"""A decode step packed with a prefill (T = 64): two one-token and one three-token sequences, each from its own
carried state (h0), then a prefill of 59 tokens, as a serving batch mixes them."""

GDN_OPTIONS = (("use_qk_l2norm_in_kernel", True), ("use_beta_sigmoid_in_kernel", True))
"""Qwen3-Next's gdn layer: q and k normalised and beta squashed inside the op."""

GDN_GATE = (("use_gate_in_kernel", True),)
"""The gate computed in the op from A_log and dt_bias (fla's ``use_gate_in_kernel``)."""

CONV = (("conv1d", 4),)
"""The short causal convolution of width 4 in front of the op (fla's ShortConvolution with SiLU, its layers'
default width), over q, k and v; with q and k normalised in the op, as the layers do."""

QWEN3_NEXT = GDN_OPTIONS + GDN_GATE + CONV
"""Qwen3-Next's gated delta rule layer as a serving kernel runs it end to end (vLLM TPU's fused conv1d + GDN):
the convolution, then the gate, beta's sigmoid and the q/k normalisation in the op."""


def _gdn_smoke() -> list[Case]:
    base = dict(op="gdn", variant="chunk", B=1, chunk_size=64)
    return [
        # grouped value heads (two per q/k head), K = V = 64, a partial last chunk (T = 64 + 36)
        Case(T=100, H=1, HV=2, K=64, V=64, dtype="bfloat16", gate=G, h0=True, dht=True, options=GDN_OPTIONS,
             **base),
        # the gate computed in the op; pre-normalised q/k and beta
        Case(T=64, H=2, K=128, V=128, dtype="bfloat16", gate=G, h0=True, options=GDN_GATE, **base),
        # packed sequences: boundaries inside chunks, the middle one two chunks of its own
        Case(T=sum(SMOKE_LENS), H=1, K=128, V=128, dtype="float32", gate=G, h0=True, dht=True, lens=SMOKE_LENS,
             **base),
        # decode: one-token and three-token sequences from carried states, beside a prefill; fla runs its
        # fused_recurrent kernel (forward only)
        Case(T=sum(DECODE_LENS), H=1, HV=2, K=64, V=64, dtype="bfloat16", gate=G, h0=True, lens=DECODE_LENS,
             options=GDN_OPTIONS, **{**base, "variant": DECODE}),
        # the whole layer: the convolution in front, from carried conv states, on packed sequences, a first
        # sequence shorter than the convolution's width; gradients of its weight and states too
        Case(T=sum(CONV_LENS), H=1, HV=2, K=64, V=64, dtype="bfloat16", gate=G, h0=True, dht=True, lens=CONV_LENS,
             options=QWEN3_NEXT, **base),
        # ... and its decode step: one-token requests continuing carried conv and recurrent states
        Case(T=sum(DECODE_LENS), H=1, HV=2, K=64, V=64, dtype="bfloat16", gate=G, h0=True, lens=DECODE_LENS,
             options=QWEN3_NEXT, **{**base, "variant": DECODE}),
    ]


CONV_LENS = (2, 37, 25)
"""Packed sequences for the convolution: one shorter than its width's state (2 < W-1 = 3: its final conv state
keeps an input of the carried state), one spanning a chunk boundary."""


def _gdn_regressions() -> list[Case]:
    base = dict(op="gdn", variant="chunk", B=1, K=128, V=128, chunk_size=64)
    return [
        # fp16 never reaches a Mosaic kernel: widened to f32 at the boundary; GVA sums dq/dk over each group
        Case(T=128, H=1, HV=2, dtype="float16", gate=G, h0=True, dht=True, options=GDN_OPTIONS, **base),
        # the in-op gate in fp32 and fp16, several chunks
        Case(T=192, H=2, dtype="float32", gate=G, h0=True, dht=True, options=GDN_GATE, **base),
        Case(T=128, H=1, dtype="float16", gate=G, h0=True, options=GDN_GATE, **base),
        # packing edges: C - 1, an exact multiple of C next to a longer sequence, C + 1, one token
        Case(T=193, H=1, dtype="float32", gate=G, h0=True, dht=True, lens=EDGE_LENS, **base),
        Case(T=sum(DECODE_LENS), H=2, HV=4, dtype="float16", gate=G, h0=True, dht=True, lens=DECODE_LENS,
             options=GDN_OPTIONS, **base),
        # decode through fla's fused_recurrent kernel in fp32 and fp16, the gate in the op; and the packing edges
        Case(T=sum(DECODE_LENS), H=2, HV=4, dtype="float32", gate=G, h0=True, lens=DECODE_LENS,
             options=GDN_OPTIONS + GDN_GATE, **{**base, "variant": DECODE}),
        Case(T=sum(DECODE_LENS), H=1, dtype="float16", gate=G, h0=True, lens=DECODE_LENS,
             **{**base, "variant": DECODE}),
        Case(T=sum(EDGE_LENS), H=1, dtype="bfloat16", gate=G, h0=True, lens=EDGE_LENS, options=GDN_OPTIONS,
             **{**base, "variant": DECODE}),
        # the convolution with a bias, fp32 and fp16, unpacked batch rows from zero conv states; kda behind it too
        Case(T=80, H=1, dtype="float32", gate=G, dht=True, options=QWEN3_NEXT + (("conv1d_bias", True),),
             **{**base, "B": 2}),
        Case(T=sum(DECODE_LENS), H=1, dtype="float16", gate=G, h0=True, lens=DECODE_LENS,
             options=QWEN3_NEXT + (("conv1d_bias", True),), **{**base, "variant": DECODE}),
        Case(T=sum(CONV_LENS), H=1, dtype="bfloat16", gate=G, h0=True, dht=True, lens=CONV_LENS,
             options=(("use_qk_l2norm_in_kernel", True),) + CONV, **{**base, "op": "kda"}),
        # fla's gate strengths per dtype (no clamp: gdn has no lower bound)
        *gate_strength_cases("gdn"),
    ]


def state_layout_cases() -> list[Case]:
    """fla's V-first state (``state_v_first``: h0, ht, dht, dh0 are [N,HV,V,K]), another set of fla kernels, on
    every op and entry point fla has it for: simple_gla's and gla's chunk, kda's and gdn's chunk and decode.
    Packed, with K != V, so a state read on the wrong axes cannot agree."""
    state = dict(B=1, T=sum(SMOKE_LENS), K=128, V=256, dtype="bfloat16", chunk_size=64, h0=True, lens=SMOKE_LENS,
                 state_v_first=True)
    kda = dict(gate=Gate("g", normalizer=16, lower_bound=-5.0), options=GDN_OPTIONS)
    return [Case("simple_gla", "chunk", H=2, gate=G, dht=True, **state),
            Case("gla", "chunk", H=2, gate=G, dht=True, **state),
            Case("kda", "chunk", H=1, HV=2, dht=True, **kda, **state),
            Case("gdn", "chunk", H=2, HV=4, gate=G, dht=True, options=GDN_OPTIONS + GDN_GATE, **state),
            Case("kda", DECODE, H=1, **kda, **{**state, "T": sum(DECODE_LENS), "lens": DECODE_LENS}),
            Case("gdn", DECODE, H=2, HV=4, gate=G, options=GDN_OPTIONS + GDN_GATE,
                 **{**state, "T": sum(DECODE_LENS), "lens": DECODE_LENS})]


def gate_masking_cases() -> list[Case]:
    """fla's tests' gate masking (``mask_p = 0.5``: half the log decays zeroed, so the state keeps everything
    at those tokens) for the ops fla masks, kda and gdn: fp16 at fla's normalizer 1, packed."""
    base = dict(variant="chunk", B=1, T=sum(SMOKE_LENS), K=128, V=128, dtype="float16", chunk_size=64, h0=True,
                dht=True, lens=SMOKE_LENS)
    return [Case("kda", H=1, gate=Gate("g", normalizer=1, lower_bound=-5.0, mask_p=0.5), options=GDN_OPTIONS,
                 **base),
            Case("gdn", H=1, HV=2, gate=Gate("g", normalizer=1, mask_p=0.5), options=GDN_OPTIONS, **base)]


def empty_sequence_cases() -> list[Case]:
    """A packing with empty sequences (fla's tests' ``cu_seqlens = [0, 0, 16]``), whose final states are their
    initial states, on every op: two empty sequences first, then one of 16 tokens, with h0 and dht."""
    base = dict(B=1, T=16, K=128, V=128, dtype="bfloat16", chunk_size=64, h0=True, dht=True, lens=(0, 0, 16))
    kda = dict(gate=Gate("g", normalizer=16, lower_bound=-5.0), options=GDN_OPTIONS)
    return [Case("simple_gla", "chunk", H=2, gate=G, **base),
            Case("gla", "chunk", H=2, gate=G, **{**base, "chunk_size": 16}),
            Case("kda", "chunk", H=2, **kda, **base),
            Case("gdn", "chunk", H=2, HV=4, gate=G, options=GDN_OPTIONS, **base)]


ZERO_LENS = (0, 70, 0, 37, 21)
"""A serving batch with requests of length 0 beside long ones (T = 128): the first and the third are empty (their
states pass through: to their write slots, with a pool), one spans two chunks, one ends inside the second."""

POOL = (("pool", 11),)
"""A pooled state buffer of 11 slots for :data:`ZERO_LENS`'s five requests (``harness.ops.serving``): each writes
its own odd slot, the odd requests read another slot, the third starts from zeros, slot 10 and the even slots of
the even requests are named by no request (they must come back bit for bit)."""


def serving_cases() -> list[Case]:
    """Serving semantics (``harness.ops.serving``) on every op: a pooled state buffer read and written by request
    index with a has-initial-state flag, decode steps continuing the prefill's final state, and requests of length
    0 beside long ones under every gate form (g; g_gamma per head and one for all heads; kda's in-kernel gate with
    its lower_bound; both gates at once is no form fla or this project's kernels take) on every op's chunk path,
    the fused ones included (simple_gla's fused_chunk, gla's fused g_gamma
    kernels: no final state, so no pool, and gdn's fused convolution)."""
    # K = V = 128: the peers' kernels take these (sglang-jax's packed simple_gla and v3's lanes need 128)
    base = dict(B=1, T=sum(ZERO_LENS), K=128, V=128, chunk_size=64, lens=ZERO_LENS, h0=True)
    decode = POOL + (("decode", 3),)
    kda_gate = (("use_gate_in_kernel", True), ("lower_bound", -5.0), ("use_qk_l2norm_in_kernel", True))
    return [
        Case("simple_gla", "chunk", H=2, dtype="bfloat16", gate=G, dht=True, options=POOL, **base),
        Case("simple_gla", "chunk", H=2, dtype="float32", gate=alibi(8, 0), dht=True, options=POOL, **base),
        Case("simple_gla", "chunk", H=2, dtype="bfloat16", gate=Gate("g_gamma", "const", value=-0.5, gamma_shape=""),
             dht=True, options=POOL, **base),
        Case("simple_gla", "fused_chunk", H=2, dtype="float16", gate=alibi(8, 0), dht=True, options=POOL, **base),
        Case("simple_gla", "fused_chunk", H=2, dtype="bfloat16", gate=G, dht=True, options=POOL, **base),
        # Ling's decode: ALiBi g_gamma, the prefill's state continued by three one-token steps
        Case("simple_gla", "chunk", H=2, dtype="bfloat16", gate=alibi(8, 0), options=decode, **base),
        Case("gla", "chunk", H=2, dtype="bfloat16", gate=G, dht=True, options=POOL, **base),
        Case("gla", "chunk", H=2, dtype="float32", gate=alibi(8, 0), final_state=False, **base),
        Case("gla", "chunk", H=2, dtype="float16", gate=G, options=decode, **base),
        Case("kda", "chunk", H=1, HV=2, dtype="bfloat16", gate=G, dht=True, options=POOL + kda_gate, **base),
        Case("kda", "chunk", H=1, dtype="float32", gate=G, options=decode + kda_gate, **base),
        # Kimi-Linear's layer as sglang-jax serves it: its in-kernel gate, q and k normalised before the kernel
        Case("kda", "chunk", H=2, dtype="bfloat16", gate=G, dht=True, options=POOL + kda_gate[:2], **base),
        Case("gdn", "chunk", H=1, HV=2, dtype="bfloat16", gate=G, dht=True, options=POOL + GDN_OPTIONS + GDN_GATE,
             **base),
        Case("gdn", "chunk", H=1, HV=2, dtype="bfloat16", gate=G, dht=True, options=POOL + QWEN3_NEXT, **base),
    ]


def state_cache_cases() -> list[Case]:
    """Serving with a low-precision state cache (``state_dtype``, ``harness.ops.serving``): the recurrent state
    written back in bf16 or fp16 after every call, as vLLM (``mamba_ssm_cache_dtype``) and tpu-inference
    (``TPU_MAMBA_SSM_CACHE_DTYPE``, bf16 by default from 0.21.0) keep it. Qwen3-Next's gdn served in both dtypes
    (a prefill, three decode steps, a pool with empty requests), kda's prefill into a bf16 pool (Kimi-Linear's
    layer), and simple_gla's ALiBi decode (Ling's) from a bf16 pool. Forward only (o, ht), as a cache serves."""
    base = dict(B=1, T=sum(ZERO_LENS), K=128, V=128, chunk_size=64, lens=ZERO_LENS, h0=True, gate=G)
    decode = POOL + (("decode", 3),)
    bf16, fp16 = (("state_dtype", "bf16"),), (("state_dtype", "fp16"),)
    return [
        Case("gdn", "chunk", H=1, HV=2, dtype="bfloat16", options=decode + GDN_OPTIONS + GDN_GATE + bf16, **base),
        Case("gdn", "chunk", H=1, HV=2, dtype="bfloat16", options=decode + GDN_OPTIONS + GDN_GATE + fp16, **base),
        Case("kda", "chunk", H=2, dtype="bfloat16",
             options=POOL + (("use_gate_in_kernel", True), ("lower_bound", -5.0)) + bf16, **base),
        Case("simple_gla", "chunk", H=2, dtype="bfloat16", options=decode + bf16, **{**base, "gate": alibi(8, 0)}),
    ]


EMPTY_LENS = (0, 0, 16)
"""fla's tests' ``cu_seqlens = [0, 0, 16]`` served: request 0 is empty and reads the slot it writes, request 1 is
empty and carries the state it reads from slot 2 into slot 3 (a prefix cache's copy), request 2 has 16 tokens from
zeros. Every length a multiple of C = 16, so gla's fused g_gamma kernels take its final state."""


def empty_state_cases() -> list[Case]:
    """An empty sequence's final state compared on every kernel path under every gate form the suites run it with
    (tests/test_empty_sequence_coverage.py): :data:`EMPTY_LENS` in a pool of 7 slots (``pool=7``), h0, ht and dht
    (the decode variants are forward only: h0 and ht). An empty request's final state is its initial state, moved
    to its write slot; a kernel that decays it over a chunk, or loses its gradient, shows in ht, dh0 (and dg_gamma).
    One case per (path, gate form); the dtypes rotate; gla at C = 16, the chunk fla picks for T = 16."""
    base = dict(B=1, T=sum(EMPTY_LENS), K=128, V=128, chunk_size=64, lens=EMPTY_LENS, h0=True, dht=True,
                options=(("pool", 7),))
    pool = base["options"]
    decode = {**base, "variant": DECODE, "dht": False}
    kda_gate = (("use_gate_in_kernel", True), ("lower_bound", -5.0))
    const = Gate("g_gamma", "const", value=-0.5, gamma_shape="")
    return [
        Case("simple_gla", "chunk", H=2, dtype="bfloat16", gate=G, **base),
        Case("simple_gla", "chunk", H=2, dtype="float32", gate=alibi(8, 0), **base),
        Case("simple_gla", "chunk", H=2, dtype="float16", gate=const, **base),
        Case("simple_gla", "fused_chunk", H=2, dtype="float16", gate=G, **base),
        Case("simple_gla", "fused_chunk", H=2, dtype="bfloat16", gate=alibi(8, 0), **base),
        Case("gla", "chunk", H=2, dtype="float32", gate=G, **{**base, "chunk_size": 16}),
        # the fused g_gamma kernels (every length a multiple of C), and the same gate forced through the chunk ones
        Case("gla", "chunk", H=2, dtype="bfloat16", gate=alibi(8, 0), **{**base, "chunk_size": 16}),
        Case("gla", "chunk", H=2, dtype="float16", gate=alibi(8, 0),
             **{**base, "chunk_size": 16, "options": pool + (("tpu_path", "chunk"),)}),
        Case("kda", "chunk", H=1, HV=2, dtype="bfloat16", gate=Gate("g", normalizer=16, lower_bound=-5.0),
             **{**base, "options": pool + GDN_OPTIONS}),
        Case("kda", "chunk", H=1, dtype="float32", gate=G,
             **{**base, "options": pool + kda_gate + (("use_qk_l2norm_in_kernel", True),)}),
        Case("kda", "chunk", H=1, dtype="bfloat16", gate=G,
             **{**base, "options": pool + (("use_qk_l2norm_in_kernel", True),) + CONV}),
        Case("kda", H=1, dtype="float16", gate=G,
             **{**decode, "options": pool + (("use_qk_l2norm_in_kernel", True),)}),
        # this case and gdn's decode with the gate in the op (below) failed ht against fla on draws 0-2 (ratios
        # 3.6-4.6 and 1.8-2.2), all of it in request 2's slot, while the TPU decoded through its chunk forward, whose
        # decays exp(G_T - G_t) carry the float32 cumulative log gate's absolute error (|G|·2^-24; the gates are
        # strong: kda's -5·sigmoid sums to |G_T| = 60 over the 16 tokens, gdn's to 10). The fused-recurrent kernel
        # (kernels_tpu.kda.recurrent: one exp(g_t) per token, one rounding per state element) passes them
        # (reports/calibration/decode-recurrent).
        Case("kda", H=1, dtype="bfloat16", gate=G, **{**decode, "options": pool + kda_gate}),
        Case("gdn", "chunk", H=1, HV=2, dtype="float16", gate=G, **{**base, "options": pool + GDN_OPTIONS}),
        Case("gdn", "chunk", H=1, HV=2, dtype="bfloat16", gate=G,
             **{**base, "options": pool + GDN_OPTIONS + GDN_GATE}),
        Case("gdn", "chunk", H=1, HV=2, dtype="float32", gate=G, **{**base, "options": pool + QWEN3_NEXT}),
        Case("gdn", H=1, HV=2, dtype="bfloat16", gate=G, **decode),
        Case("gdn", H=1, HV=2, dtype="float32", gate=G, **{**decode, "options": pool + GDN_OPTIONS + GDN_GATE}),
        Case("gdn", H=1, HV=2, dtype="bfloat16", gate=G, **{**decode, "options": pool + QWEN3_NEXT}),
    ]


def gdn_serving_smoke() -> list[Case]:
    """Qwen3-Next's gdn served: a pooled state buffer, a zero-length request, three decode steps after the
    prefill."""
    return [Case("gdn", "chunk", B=1, T=sum(ZERO_LENS), H=1, HV=2, K=128, V=128, dtype="bfloat16", gate=G,
                 chunk_size=64, h0=True, lens=ZERO_LENS, options=POOL + (("decode", 3),) + GDN_OPTIONS + GDN_GATE)]


def _gdn_standard() -> list[Case]:
    out = [Case("gdn", "chunk", B=2, T=512, H=2, HV=4, K=128, V=128, dtype=dtype, gate=G, chunk_size=64, h0=True,
                dht=True, options=opts)
           for dtype, opts in itertools.product(("bfloat16", "float16", "float32"),
                                                (GDN_OPTIONS, GDN_OPTIONS + GDN_GATE))]
    out.append(Case("gdn", "chunk", B=1, T=sum(STANDARD_LENS), H=2, HV=4, K=128, V=128, dtype="bfloat16", gate=G,
                    chunk_size=64, h0=True, dht=True, lens=STANDARD_LENS, options=GDN_OPTIONS + GDN_GATE))
    return out + gate_strength_cases("gdn", ("float16",), T=1000, H=4)


def _gdn_stress() -> list[Case]:
    # Qwen3-Next's gdn layer: 16 q/k heads, 32 value heads, K = V = 128, a training-like packing
    return [Case("gdn", "chunk", B=1, T=sum(STRESS_LENS), H=16, HV=32, K=128, V=128, dtype="bfloat16", gate=G,
                 chunk_size=64, h0=True, dht=True, lens=STRESS_LENS, options=GDN_OPTIONS + GDN_GATE)]


def _kda_gva_and_decode() -> list[Case]:
    """kda with grouped value heads (fla's chunk_kda takes HV > H), and kda's decode (fla's fused_recurrent_kda)."""
    gate, opts = (Gate("g", normalizer=16, lower_bound=-5.0),
                  (("use_qk_l2norm_in_kernel", True), ("use_beta_sigmoid_in_kernel", True)))
    return [Case("kda", "chunk", B=1, T=100, H=1, HV=2, K=64, V=64, dtype="bfloat16", gate=gate, chunk_size=64,
                 h0=True, dht=True, options=opts),
            Case("kda", DECODE, B=1, T=sum(DECODE_LENS), H=1, HV=2, K=64, V=64, dtype="bfloat16", gate=gate,
                 chunk_size=64, h0=True, lens=DECODE_LENS, options=opts)]


def _kda_decode_regressions() -> list[Case]:
    """kda's decode in fp32 and fp16 (the gate in the op, fla's lower bound), and at the packing edges."""
    base = dict(B=1, H=1, K=128, V=128, gate=G, chunk_size=64, h0=True)
    return [Case("kda", DECODE, T=sum(DECODE_LENS), dtype="float32", lens=DECODE_LENS,
                 options=(("use_gate_in_kernel", True), ("lower_bound", -5.0)), **base),
            Case("kda", DECODE, T=sum(DECODE_LENS), dtype="float16", lens=DECODE_LENS,
                 options=(("use_qk_l2norm_in_kernel", True),), **base),
            Case("kda", DECODE, T=sum(EDGE_LENS), dtype="bfloat16", lens=EDGE_LENS,
                 options=(("use_qk_l2norm_in_kernel", True),), **base)]


def _gated_decode_smoke() -> list[Case]:
    """simple_gla's and gla's decode (fla's fused_recurrent_simple_gla / fused_recurrent_gla, forward and backward;
    kernels_tpu.gated_recurrent on the TPU), small: a decode batch packed with a prefill, simple_gla under both gates
    at once (only fla's fused_recurrent_simple_gla takes them) and gla under its constant per-channel gate
    g_gamma[H,K]. Two cases: each adds about 20 s to the suite on a loaded 2-core machine."""
    base = dict(variant=DECODE, B=1, H=1, K=64, V=64, chunk_size=64, h0=True, dht=True, T=sum(DECODE_LENS),
                lens=DECODE_LENS)
    return [
        Case("simple_gla", dtype="bfloat16", gate=G, gamma=Gate("g_gamma", "halfnormal", normalizer=10), **base),
        Case("gla", dtype="float16", gate=Gate("g_gamma", "halfnormal", normalizer=10, gamma_shape="H,K"), **base),
    ]


def _gated_decode_regressions() -> list[Case]:
    """simple_gla's and gla's decode: every gate form (g; g_gamma [], [H], [H,K]; both at once) with empty
    sequences in a state pool (fla's ``cu_seqlens = [0, 0, 16]``, request 1 carrying the state it reads from
    another slot), fla's strong decay with its lower bound, fp16 and fp32."""
    empty = dict(variant=DECODE, B=1, T=sum(EMPTY_LENS), K=128, V=128, chunk_size=64, lens=EMPTY_LENS, h0=True,
                 dht=True, H=2, options=(("pool", 7),))
    const = Gate("g_gamma", "const", value=-0.5, gamma_shape="")
    per_channel = Gate("g_gamma", "halfnormal", normalizer=10, gamma_shape="H,K")
    strong = gate_strength(0.1, -5.0)
    dense = dict(variant=DECODE, B=1, T=64, H=1, K=128, V=128, chunk_size=64, h0=True, dht=True)
    return [
        Case("simple_gla", dtype="bfloat16", gate=G, **empty),
        Case("simple_gla", dtype="float16", gate=const, **empty),
        Case("simple_gla", dtype="float32", gate=alibi(8, 0), **empty),
        Case("simple_gla", dtype="bfloat16", gate=G, gamma=alibi(8, 0), **empty),
        Case("gla", dtype="float32", gate=G, **empty),
        Case("gla", dtype="bfloat16", gate=const, **empty),
        Case("gla", dtype="float16", gate=alibi(8, 0), **empty),
        Case("gla", dtype="bfloat16", gate=per_channel, **empty),
        Case("gla", dtype="float32", gate=G, gamma=per_channel, **empty),
        Case("simple_gla", dtype="float32", gate=G, gamma=const, **empty),
        Case("gla", dtype="bfloat16", gate=G, gamma=const, **empty),
        Case("gla", dtype="float16", gate=G, gamma=alibi(8, 0), **empty),
        # fla's strong decay (logsigmoid / 0.1, lower bound -5): a state is little more than its last outer product;
        # simple_gla's in fp16 and fp32 with a constant gate beside it (both at once: the log decays add; fla's
        # fused_recurrent_simple_gla takes both, fla's gla does not, so gla's stay compared against fla with g alone)
        *(Case("simple_gla", dtype=dtype, gate=strong, gamma=gamma, **dense)
          for dtype, gamma in (("bfloat16", None), ("float16", const), ("float32", alibi(8, 0)))),
        *(Case("gla", dtype=dtype, gate=strong, **dense) for dtype in ("bfloat16", "float16", "float32")),
        # gla's both gates at once, unpacked, from h0 (no fla form: judged against the float64 reference's bounds)
        *(Case("gla", dtype="float32", gate=G, gamma=gamma, **{**dense, "T": 32})
          for gamma in (const, alibi(8, 0), per_channel)),
        # each constant gate alone, unpacked, from h0
        *(Case(op, dtype="bfloat16", gate=gamma, **{**dense, "T": 32}) for op in ("simple_gla", "gla")
          for gamma in (const, alibi(8, 0))),
        Case("gla", dtype="float16", gate=per_channel, **{**dense, "T": 32}),
        # the packing edges (one token, C - 1, C, C + 1 at C = 64) per gate kind: the decode steps take no chunks,
        # but the kernel walks 8-token steps, and every sequence's last step is filled with identity tokens
        *(Case(op, DECODE, B=1, T=sum(EDGE_LENS), H=1, K=128, V=128, dtype=dtype, gate=gate, chunk_size=64, h0=True,
               dht=True, lens=EDGE_LENS)
          for op, dtype, gate in (("simple_gla", "float32", G), ("simple_gla", "bfloat16", alibi(8, 0)),
                                  ("gla", "bfloat16", G), ("gla", "float16", per_channel))),
        # gla's chunk kernels under g_gamma[H,K] (broadcast to a per-channel g) with empty requests in a pool
        Case("gla", dtype="bfloat16", gate=per_channel, **{**empty, "variant": "chunk", "chunk_size": 16}),
        # simple_gla's fused_chunk and gla's chunk kernels under a constant gate from h0, unpacked
        Case("simple_gla", "fused_chunk", B=1, T=64, H=2, K=128, V=128, dtype="bfloat16", gate=alibi(8, 0),
             chunk_size=64, h0=True, dht=True),
        Case("gla", "chunk", B=1, T=64, H=2, K=128, V=128, dtype="float32", gate=per_channel, chunk_size=64,
             h0=True, dht=True),
    ]


GDN2_GATE = (("use_gate_in_kernel", True), ("lower_bound", -5.0))
"""gdn2's gate computed in the op (kda's, fla's bounded form at its safe-gate floor), with A_log and dt_bias."""

NEG_EIGVAL = (("allow_neg_eigval", True),)
"""gdn2's erase gate drawn in [0, 2] (2 sigmoid): the layer's negative eigenvalues."""


def _gdn2_smoke() -> list[Case]:
    """GDN-2 (fla's chunk_gdn2 and fused_recurrent_gdn2): bf16 through two chunks with the gate and the q/k norm in
    the op; fp32 packed with an empty sequence, its erase gate in [0, 2]; the decode step with grouped value
    heads."""
    base = dict(op="gdn2", B=1, chunk_size=64, h0=True)
    return [
        Case(variant="chunk", T=128, H=1, K=128, V=128, dtype="bfloat16", gate=G, dht=True,
             options=GDN2_GATE + (("use_qk_l2norm_in_kernel", True),), **base),
        Case(variant="chunk", T=sum(ZERO_LENS[:3]), H=1, K=64, V=64, dtype="float32", gate=G, dht=True,
             lens=ZERO_LENS[:3], options=NEG_EIGVAL, **base),
        Case(variant=DECODE, T=sum(DECODE_LENS), H=1, HV=2, K=64, V=64, dtype="bfloat16",
             gate=Gate("g", normalizer=16, lower_bound=-5.0), lens=DECODE_LENS,
             options=(("use_qk_l2norm_in_kernel", True),), **base),
    ]


def _gdn2_regressions() -> list[Case]:
    """GDN-2's grid as kda's: dtypes x gate forms (pre-computed, in the op, fla's safe gate) x erase range x packing
    x state layout x decode, and its empty sequences in a pool (every kernel path's final state)."""
    base = dict(op="gdn2", B=1, K=128, V=128, chunk_size=64, h0=True)
    bounded = Gate("g", normalizer=16, lower_bound=-5.0)
    l2 = (("use_qk_l2norm_in_kernel", True),)
    pool = (("pool", 7),)
    return [
        # fp16 widened at the kernels' boundary; b in [0, 2]
        Case(variant="chunk", T=128, H=2, dtype="float16", gate=G, dht=True, options=NEG_EIGVAL, **base),
        # fla's safe-gate path with the gate in the op
        Case(variant="chunk", T=64, H=1, dtype="bfloat16", gate=G, options=GDN2_GATE + (("safe_gate", True),),
             **base),
        # several chunks and batch rows with a non-zero dht: the WY backward across chunk boundaries
        Case(variant="chunk", T=256, H=2, dtype="float32", gate=G, dht=True, options=l2, **{**base, "B": 2}),
        # every chunk edge in one packing; the strong gate clamped at -5
        Case(variant="chunk", T=sum(EDGE_LENS), H=1, dtype="bfloat16", gate=Gate("g", normalizer=0.1,
             lower_bound=-5.0), dht=True, lens=EDGE_LENS, options=l2, **base),
        # the V-first state, K != V, packed; chunk and decode (grouped value heads)
        Case(variant="chunk", T=sum(SMOKE_LENS), H=2, dtype="bfloat16", gate=bounded, dht=True, lens=SMOKE_LENS,
             state_v_first=True, options=l2, **{**base, "V": 256}),
        Case(variant=DECODE, T=sum(DECODE_LENS), H=1, HV=2, dtype="bfloat16", gate=bounded, lens=DECODE_LENS,
             state_v_first=True, options=l2, **{**base, "V": 256}),
        # the layer's convolution in front, the gate in the op, served from a pool with an empty request that reads
        # another slot than it writes (harness.ops.serving.slots: request 1)
        Case(variant="chunk", T=sum(CONV_LENS), H=1, dtype="bfloat16", gate=G, dht=True, lens=(2, 0, 37, 25),
             options=(("pool", 9),) + GDN2_GATE + l2 + CONV, **base),
        # decode in fp32, the gate in the op, served: an empty request among the decode steps; fp16 at the edges
        Case(variant=DECODE, T=sum(DECODE_LENS), H=1, dtype="float32", gate=G, lens=(1, 0, 1, 3, 59),
             options=POOL + GDN2_GATE, **base),
        Case(variant=DECODE, T=sum(EDGE_LENS), H=1, dtype="float16", gate=bounded, lens=EDGE_LENS,
             options=l2 + NEG_EIGVAL, **base),
        # empty requests in a pool (EMPTY_LENS): an empty sequence's final state on the chunk and decode paths
        Case(variant="chunk", T=sum(EMPTY_LENS), H=1, dtype="bfloat16", gate=G, dht=True, lens=EMPTY_LENS,
             options=pool + GDN2_GATE + l2, **base),
        Case(variant="chunk", T=sum(EMPTY_LENS), H=1, dtype="float16", gate=bounded, dht=True, lens=EMPTY_LENS,
             options=pool + l2, **base),
        Case(variant=DECODE, T=sum(EMPTY_LENS), H=1, HV=2, dtype="float32", gate=bounded, lens=EMPTY_LENS,
             options=pool + l2, **base),
    ]


def production_cases() -> list[Case]:
    """The shapes the peers' models train with (issue 51): one training step's forward and backward, K = V = 128,
    bf16, one 4096-token sequence, the layer's options as the model sets them. fla's rows at these shapes take the
    emulated GPU leg's batched grid (docs/legs.md); they are committed under ``reports/production/`` and
    served to ``--baseline-rows``."""
    conv = (("conv1d", 4),)
    base = dict(variant="chunk", B=1, T=4096, K=128, V=128, dtype="bfloat16", chunk_size=64)
    return [
        # Qwen3-Next's gated DeltaNet: 16 q/k heads, 32 value heads, the short convolution, gate and norms in the op
        Case("gdn", H=16, HV=32, gate=G, options=conv + GDN_OPTIONS + GDN_GATE, **base),
        # Kimi-Linear's KDA: 32 heads, the short convolution, the per-channel gate computed in the op
        Case("kda", H=32, gate=G, options=conv + GDN_OPTIONS + GDN_GATE, **base),
        # Ling's lightning attention: one fixed decay per head (ALiBi slopes), 16 heads
        Case("simple_gla", H=16, gate=alibi(20, 10), **base),
        # fla's GLA layer: a per-channel data-dependent gate, 16 heads
        Case("gla", H=16, gate=G, **base),
        # fla's GatedDeltaNet2 layer: the erase and write gates, gate and q/k norm in the op, 16 heads
        Case("gdn2", H=16, gate=G, options=GDN2_GATE + (("use_qk_l2norm_in_kernel", True),), **base),
    ]


# suite name -> the per-op case lists it is made of (adding an op adds its lists here)
SUITES = {
    "smoke": (_simple_gla_smoke, _gla_smoke, _kda_smoke, _kda_gva_and_decode, _gdn_smoke, gdn_serving_smoke,
              _gdn2_smoke, _gated_decode_smoke),
    "regressions": (_simple_gla_regressions, _gla_regressions, _kda_regressions, _kda_decode_regressions,
                    _gdn_regressions, packing_edge_cases, state_layout_cases, gate_masking_cases,
                    empty_sequence_cases, serving_cases, state_cache_cases, empty_state_cases, _gdn2_regressions,
                    _gated_decode_regressions),
    "standard": (_simple_gla_standard, _gla_standard, _kda_standard, _gdn_standard),
    "stress": (_simple_gla_stress, _gla_stress, _kda_stress, _gdn_stress),
    "production": (production_cases,),
    # a seeded sample of the shapes users add, not the suites' own: where the false-alarm rate is measured
    "user-like": (user_like_cases,),
}


def get_suite(name: str) -> list[Case]:
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; choose one of {sorted(SUITES)}")
    cases = [case for make in SUITES[name] for case in make()]
    ids = [c.id for c in cases]
    dupes = {i for i in ids if ids.count(i) > 1}
    if dupes:
        raise ValueError(f"suite {name!r} has duplicate case ids: {sorted(dupes)}")
    return cases


def with_draws(cases: list[Case], draws: int) -> list[Case]:
    """Each case over ``draws`` input draws: seeds 0 (the case itself) to draws-1, draw-major within a case."""
    if isinstance(draws, bool) or not isinstance(draws, int) or draws < 1:
        raise ValueError(f"--draws {draws!r} must be a positive int")
    return [case.replace(seed=seed) for case in cases for seed in range(case.seed, case.seed + draws)]


def find_case(case_id: str, ops: Callable[[str], Any]) -> Case:
    """The case this id names, for one-line repros and user cases: the suite case when a suite holds it (at
    any draw, ``seed=N`` in the id), otherwise the case the id describes (:meth:`Case.from_id`, validated
    against its op, looked up with ``ops``: ``harness.app.find_case`` passes the registry's). A malformed id,
    or one naming a case its op cannot run, raises ValueError (one line)."""
    parsed = Case.from_id(case_id, ops=ops)
    for name in SUITES:
        for case in get_suite(name):
            if case.replace(seed=parsed.seed).id == parsed.id:
                return case.replace(seed=parsed.seed)
    return parsed
