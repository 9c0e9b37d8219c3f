"""tops (GitHub primatrix/pallas-kernel, package ``tops``) as a candidate: its Pallas TPU kernels on simple_gla,
gla and kda, through its public entry points.

Each harness op and variant maps onto one tops entry point, called with the case's tensors as the harness draws
them (q, k, v in the case dtype; gates, h0 in float32), ``scale=case.resolved_scale``, the case's chunk size,
``initial_state=h0`` (K-first ``[N, H, K, V]``, tops' layout too) and ``output_final_state`` (``ht``):

- ``simple_gla.chunk`` / ``simple_gla.fused_chunk``: ``tops.ops.simple_gla(q, k, v, g_gamma=[H],
  mode="chunk" | "fused_chunk", chunk_size=C)``, ``custom_vjp``s (their own backward kernels). tops pads T to a
  multiple of C and K, V to multiples of 128 itself. A scalar ``g_gamma[]`` is broadcast to [H] (exact). Their
  backward returns zeros for g_gamma by design (tops: "g_gamma is treated as a fixed per-head hyperparameter"):
  declared ``no_gradient``, so dg_gamma rows are ``not_provided`` with that reason.
- ``simple_gla.fused_recurrent``: ``simple_gla(..., g=, g_gamma=, mode="fused_recurrent", cu_seqlens_cpu=...)``,
  both gates at once included (pure JAX ``lax.scan``; gradients by jax's autodiff).
- ``gla.chunk``: ``tops.ops.gla.chunk_gla(q, k, v, g=[B,T,H,K] | g_gamma=..., chunk_size=C, cu_seqlens=...)``.
  tops takes ``g_gamma`` "broadcastable to [B, T, H, K]": ``[H]`` is passed as ``[H, 1]`` (``[H]`` itself would
  broadcast over K), ``[]`` and ``[H, K]`` as they are. Packed cases pass ``cu_seqlens``. tops'
  ``fused_chunk_gla`` "delegates to chunk_gla"; the harness has no ``gla.fused_chunk`` variant to bind it to.
- ``gla.fused_recurrent``: ``tops.ops.gla.fused_recurrent_gla(q, k, v, gk=..., cu_seqlens=...)``; a ``g_gamma``
  of any form is broadcast to ``gk`` [B, T, H, K] (exact).
- gla is forward only (``differentiable=False``): neither public entry point has a ``custom_vjp`` (tops'
  ``chunk_gla_bwd`` and ``fused_recurrent_gla_bwd`` are separate functions they do not use), and jax cannot
  differentiate their Pallas forwards ("Linearization failed to produce known values for all output primals").
- ``kda.chunk``: ``tops.ops.chunk_kda(q, k, v, g, beta, scale, initial_state, output_final_state, None,
  chunk_size)``, a ``custom_vjp``; ``kda.fused_recurrent`` (the harness's forward-only decode variant):
  ``tops.ops.fused_recurrent_kda`` (pure JAX, ``lax.scan``).

Refused, with the reason (an ``unsupported`` row):

- what tops' own checks reject, in tops' words (``tops refuses the case: ...``): a ``ValueError`` or
  ``AssertionError`` raised by a ``raise`` or ``assert`` in tops' source (e.g. "mode='chunk' does not support
  per-token gate `g`", "... does not support `cu_seqlens`", ``[v] Expected shape ...`` for grouped value
  heads, "Sequence length T=... must be divisible by chunk_size" in ``chunk_kda``). A ValueError raised
  inside jax while it traces a tops kernel (e.g. Pallas's "Invalid dtype for `swap`") is tops breaking, not
  refusing: an ``error`` row, as is anything else tops raises;
- kda's in-kernel options (``use_qk_l2norm_in_kernel``, ``use_beta_sigmoid_in_kernel``,
  ``use_gate_in_kernel``, ``lower_bound``, ``safe_gate``, ``allow_neg_eigval``): tops' ``chunk_kda`` and
  ``fused_recurrent_kda`` take none of them (pre-normalised q, k, beta as given, g as the log decay);
- packed kda cases: ``chunk_kda``'s docstring says its ``cu_seqlens`` is "variable-length mode (not yet
  supported)" (its state pass ignores it), ``fused_recurrent_kda`` has no such parameter;
- gla with both gates at once: ``chunk_gla`` uses g_gamma "only when g is None" (it would drop it), and
  ``fused_recurrent_gla`` takes one gate (``gk``), which only a rounding sum would reach;
- a missing install (``tops is not installed (...)``), or an import that fails (its error).

The leg forces interpret mode itself (``pltpu.force_tpu_interpret_mode``); this binding tells tops nothing about
it. tops decides on its own: most kernels read ``PALLAS_INTERPRET`` (``tops.ops.utils.get_interpret``), the
fused_chunk kernels use ``interpret = not is_tpu_runtime()`` and then give g_gamma the ``pltpu.ANY`` memory
space instead of SMEM (``tops/ops/common/fused_chunk.py``, ``simple_gla/fused_chunk.py``).

tops is imported when this module is (outside any trace: it computes jnp constants at import, which fails
under the leg's trace with a ConcretizationTypeError); without it this module still imports, and every case
is refused with the install command. Install it with its own stack (Python >= 3.12; its uv.lock pins jax
0.9.2, libtpu 0.0.37): ``pip install --no-deps 'tops @ git+https://github.com/primatrix/pallas-kernel@<sha>'``
and einops (flax only for its layers, which this binding does not import; jax 0.9.2's Pallas TPU module also
imports absl-py, which jax 0.9.2 does not declare); from the archive in
``../shared/peers/``, ``SETUPTOOLS_SCM_PRETEND_VERSION=0.1.0+d7c3294 pip install --no-deps <unpacked dir>``.
"""

from __future__ import annotations

from harness.ops import gated
from harness.ops.base import LegBinding

INSTALL = ("pip install --no-deps 'tops @ git+https://github.com/primatrix/pallas-kernel@<sha>' einops; "
           "Python >= 3.12")

try:  # at import, outside any trace (see the module doc)
    import tops.ops as _ops
    import tops.ops.gla as _gla
    IMPORT_ERROR = None
except ModuleNotFoundError as exc:
    _ops = _gla = None
    IMPORT_ERROR = (f"tops is not installed ({INSTALL})" if (exc.name or "").partition(".")[0] == "tops"
                     else f"tops could not be imported: {type(exc).__name__}: {exc}")
except Exception as exc:  # noqa: BLE001 - any import failure is the reason for every row
    _ops = _gla = None
    IMPORT_ERROR = f"tops could not be imported: {type(exc).__name__}: {exc}"

KDA_OPTIONS = ("use_qk_l2norm_in_kernel", "use_beta_sigmoid_in_kernel", "use_gate_in_kernel", "lower_bound",
               "safe_gate", "allow_neg_eigval", "conv1d", "conv1d_bias")

ENTRY = {
    ("simple_gla", "chunk"): "tops.ops.simple_gla(mode='chunk')",
    ("simple_gla", "fused_chunk"): "tops.ops.simple_gla(mode='fused_chunk')",
    ("simple_gla", "fused_recurrent"): "tops.ops.simple_gla(mode='fused_recurrent')",
    ("gla", "chunk"): "tops.ops.gla.chunk_gla",
    ("gla", "fused_chunk"): "tops.ops.gla.fused_chunk_gla",
    ("gla", "fused_recurrent"): "tops.ops.gla.fused_recurrent_gla",
    ("kda", "chunk"): "tops.ops.chunk_kda",
    ("kda", "fused_recurrent"): "tops.ops.fused_recurrent_kda",
}

ZERO_DG_GAMMA = ("tops' simple_gla backward returns zeros for g_gamma by design ('g_gamma is treated as a fixed "
                 "per-head hyperparameter', tops/ops/simple_gla/chunk.py and fused_chunk.py)")


def _refusal(case) -> str | None:
    if IMPORT_ERROR:
        return IMPORT_ERROR
    if (case.op, case.variant) not in ENTRY:
        return f"tops has no entry point for {case.op}.{case.variant}"
    return None


def supports_gla(case) -> str | None:
    if _refusal(case):
        return _refusal(case)
    if gated.both_gates(case):
        if case.variant == "fused_recurrent":
            return ("tops.ops.gla.fused_recurrent_gla takes one key-wise gate (gk): g and g_gamma at once have no "
                    "exact mapping onto it")
        return (f"{ENTRY[('gla', case.variant)]} uses g_gamma 'only when g is None' (its docstring): given both, "
                f"it would drop g_gamma")
    return None


def no_gradient(case) -> dict:
    """tops' chunk and fused_chunk simple_gla return a zero gradient for g_gamma by design."""
    if case.op == "simple_gla" and case.variant in ("chunk", "fused_chunk") and gated.gamma_shape(case) is not None:
        return {"g_gamma": ZERO_DG_GAMMA}
    return {}


def supports_kda(case) -> str | None:
    if _refusal(case):
        return _refusal(case)
    given = [name for name in KDA_OPTIONS if case.opt.get(name)]
    if given:
        return (f"{ENTRY[('kda', case.variant)]} takes no {', '.join(given)} (its q, k are taken as given, beta "
                f"as given, g as the log decay)")
    if case.cu_seqlens is not None:
        if case.variant == "chunk":
            return ("tops.ops.chunk_kda: packed sequences are 'variable-length mode (not yet supported)' "
                    "(its docstring for cu_seqlens; its state pass ignores it)")
        return "tops.ops.fused_recurrent_kda takes no cu_seqlens (packed sequences)"
    return None


def _raised_by_tops(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by a ``raise`` or ``assert`` statement in tops' own source (its input checks),
    not inside jax (Pallas's checks of tops' kernels, e.g. "Invalid dtype for `swap`", are errors, not
    refusals). jax's traceback filtering may drop its own frames, leaving tops' call site last: that line is a
    call, not a raise or an assert."""
    import linecache
    from pathlib import Path

    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    filename = tb.tb_frame.f_code.co_filename
    if not Path(filename).resolve().is_relative_to(Path(_ops.__file__).resolve().parents[1]):
        return False
    return linecache.getline(filename, tb.tb_lineno).lstrip().startswith(("raise ", "assert "))


def _call(fn, *args, **kwargs):
    """``fn(*args, **kwargs)``; tops' own input checks (a ValueError or AssertionError raised by tops' code
    itself) become refusals, in its words; anything else propagates (an ``error`` row)."""
    try:
        return fn(*args, **kwargs)
    except (ValueError, AssertionError) as exc:
        if not _raised_by_tops(exc):
            raise
        raise NotImplementedError(f"tops refuses the case: {type(exc).__name__}: {exc}") from None


def _cu_seqlens(case):
    import numpy as np

    return None if case.cu_seqlens is None else np.asarray(case.cu_seqlens, np.int32)


def forward_simple_gla(case, a, ctx):
    del ctx  # the candidate leg forces interpret mode itself
    g_gamma = gated.per_head_gamma(a.get("g_gamma"), case.H)  # [] broadcast to tops' [H] (exact)
    o, ht = _call(_ops.simple_gla, a["q"], a["k"], a["v"], g=a.get("g"), g_gamma=g_gamma,
                  scale=case.resolved_scale, initial_state=a.get("h0"), output_final_state=case.final_state,
                  chunk_size=case.chunk_size, cu_seqlens_cpu=_cu_seqlens(case), mode=case.variant)
    return {"o": o, "ht": ht}


def forward_gla(case, a, ctx):
    del ctx
    common = dict(scale=case.resolved_scale, initial_state=a.get("h0"), output_final_state=case.final_state,
                  cu_seqlens=_cu_seqlens(case))
    if case.variant == "fused_recurrent":  # gk only: a g_gamma of any form broadcast to [B, T, H, K] (exact)
        gk = a["g"] if "g" in a else gated.per_channel_gamma(a["g_gamma"], a["q"])
        o, ht = _call(_gla.fused_recurrent_gla, a["q"], a["k"], a["v"], gk=gk, **common)
    else:
        fn = _gla.chunk_gla if case.variant == "chunk" else _gla.fused_chunk_gla
        gate = {"g": a["g"]} if "g" in a else {"g_gamma": _gla_gamma(a["g_gamma"])}
        o, ht = _call(fn, a["q"], a["k"], a["v"], chunk_size=case.chunk_size, **gate, **common)
    return {"o": o, "ht": ht}


def _gla_gamma(g_gamma):
    """A g_gamma [], [H] or [H, K] in the form chunk_gla broadcasts to [B, T, H, K]: [H] as [H, 1] (as it is, [H]
    would broadcast over K), [] and [H, K] as they are."""
    return g_gamma[:, None] if g_gamma.ndim == 1 else g_gamma


def forward_kda(case, a, ctx):
    del ctx
    args = (a["q"], a["k"], a["v"], a["g"], a["beta"], case.resolved_scale, a.get("h0"), case.final_state)
    if case.variant == "fused_recurrent":
        o, ht = _call(_ops.fused_recurrent_kda, *args)
    else:
        o, ht = _call(_ops.chunk_kda, *args, None, case.chunk_size)
    return {"o": o, "ht": ht}


def describe(case) -> dict:
    out = {"entry": ENTRY.get((case.op, case.variant), "none")}
    shape = gated.gamma_shape(case) if case.op in ("simple_gla", "gla") else None
    if case.op == "simple_gla" and shape == "":
        out["gate_mapping"] = "g_gamma [] broadcast to [H] (exact)"
    if case.op == "gla" and shape is not None:
        out["gate_mapping"] = ("g_gamma broadcast to gk [B, T, H, K] (exact)" if case.variant == "fused_recurrent"
                               else f"g_gamma [{shape}] passed as {'[H, 1]' if shape == 'H' else f'[{shape}]'} "
                                    f"(chunk_gla broadcasts it to [B, T, H, K])")
    if case.op == "simple_gla" and case.variant == "fused_recurrent":
        out["backward"] = "jax autodiff through tops' lax.scan (no custom_vjp)"
    if case.op == "gla":
        out["backward"] = (f"none: {ENTRY[('gla', case.variant)]} has no custom_vjp, and its Pallas forward cannot "
                           f"be differentiated by jax")
    return out


TESTS = "tests/ops/{}"
BF16_ULPS = {"max_ulp": 4, "ulp_dtype": "bfloat16"}
TESTS_RULE = {
    "summary": ("tops' own tests' compare_tensor at d7c3294, per entry point (peers/tops.py TESTS_RULE): "
                "|ref - got| <= atol + rtol |got|, or within max_ulp bf16 ULPs"),
    "relative_to": "candidate",  # compare_tensor(gold, tensor): np.allclose(gold, tensor), rtol times |tensor|
    "by_variant": {
        # test_chunk_fwd_vs_cpu: atol = min(5e-2, 1e-2 + 1e-2 * max(T // C, 1)), rtol 5e-2, max_ulp 4; ht max(atol, 5e-2)
        "simple_gla.chunk": {"test": TESTS.format("simple_gla/test_chunk_simple_gla_tpu.py"),
                             "o": {"atol": 1e-2, "atol_per_chunk": 1e-2, "atol_max": 5e-2, "rtol": 5e-2,
                                   **BF16_ULPS},
                             "ht": {"atol": 5e-2, "rtol": 5e-2, **BF16_ULPS}},
        # test_fused_chunk_fwd_vs_cpu: atol = min(5e-2, 2e-2 + 1e-2 * max(T // C, 1)); ht max(atol, 5e-2)
        "simple_gla.fused_chunk": {"test": TESTS.format("simple_gla/test_fused_chunk_simple_gla_tpu.py"),
                                   "o": {"atol": 2e-2, "atol_per_chunk": 1e-2, "atol_max": 5e-2, "rtol": 5e-2,
                                         **BF16_ULPS},
                                   "ht": {"atol": 5e-2, "rtol": 5e-2, **BF16_ULPS}},
        # _run_recurrent: compare_tensor(atol=1e-5, rtol=1e-5) on o and ht (max_ulp 1, bf16 ULPs)
        "simple_gla.fused_recurrent": {"test": TESTS.format("simple_gla/test_simple_gla_tpu.py"),
                                       "*": {"atol": 1e-5, "rtol": 1e-5, "max_ulp": 1, "ulp_dtype": "bfloat16"}},
        # test_pallas_chunk_gla.py: atol = rtol = 1e-5 by default
        "gla.chunk": {"test": TESTS.format("gla/test_pallas_chunk_gla.py"),
                      "*": {"atol": 1e-5, "rtol": 1e-5, "max_ulp": 1, "ulp_dtype": "bfloat16"}},
        # test_pallas_fused_recurrent.py: atol = rtol = 1e-4 by default
        "gla.fused_recurrent": {"test": TESTS.format("gla/test_pallas_fused_recurrent.py"),
                                "*": {"atol": 1e-4, "rtol": 1e-4, "max_ulp": 1, "ulp_dtype": "bfloat16"}},
        # kda: no rule. tests/ops/kda/test_chunk_kda_tpu.py compares gradients of an intra-chunk kernel only
        # (dq, dk, db, dg at atol 5e-3, rtol 5e-2), no forward output of chunk_kda
    },
}
"""The tolerances tops' own TPU tests (tests/ops/**/test_*_tpu.py and test_pallas_*.py at d7c3294) hold each entry
point's forward to, as :mod:`harness.report.peer_report` applies them to the same rows (``peers.md``'s own rule): their
``compare_tensor`` (tests/utils.py) passes where ``np.allclose(ref, got, atol, rtol)`` holds or every element is
within ``max_ulp`` bf16 ULPs (its default dtype). Their defaults per test function; a test's per-case overrides
(e.g. gla.fused_recurrent's atol 5e-6 on two cases) are not applied."""


class Tops:
    """The implementation object (:mod:`harness.legs.external`)."""

    tests_rule = TESTS_RULE

    distribution = "tops"  # the rows' version: tops', not this project's (which ships the binding)
    bindings = {"simple_gla": LegBinding(forward_simple_gla, _refusal, describe=describe,
                                         no_gradient=no_gradient),
                "gla": LegBinding(forward_gla, supports_gla, describe=describe, differentiable=False),
                "kda": LegBinding(forward_kda, supports_kda, describe=describe)}



IMPLEMENTATION = Tops()
