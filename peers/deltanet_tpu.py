"""deltanet-tpu (PyPI, Apache-2.0, import name ``deltanet_tpu``) as candidates: its chunked Pallas TPU kernels for
the gated delta rule family (gdn, kda, gla, simple_gla and gdn2), forward and backward, through its public entry
points.

Every entry point is one kernel, ``chunk_gdn2`` (GDN-2: a per-channel log decay ``g``, an erase gate ``b`` on k, a
write gate ``w`` on v), with a ``custom_vjp`` whose backward is Pallas too. Each harness op maps onto the entry
point that fixes GDN-2's gates as fla's op has them, called with the case's tensors as the harness draws them (q,
k, v, beta, b, w in the case dtype; g and h0 in float32), ``scale=case.resolved_scale``, ``initial_state=h0`` (K-first
``[B, HV, K, V]``, its layout too), ``output_final_state`` and ``chunk_size=128``:

- ``gdn.chunk``: ``deltanet_tpu.chunk_gdn(q, k, v, g [B,T,HV], beta [B,T,HV])`` (it passes beta as both gates);
- ``kda.chunk``: ``deltanet_tpu.chunk_kda(q, k, v, g [B,T,HV,K], beta [B,T,HV])``;
- ``gla.chunk``: ``deltanet_tpu.chunk_gla(q, k, v, g [B,T,H,K])`` (erase gate 0, write gate 1). A ``g_gamma`` of
  any form ([], [H], [H,K]) is broadcast to g's [B,T,H,K] (exact);
- ``simple_gla.chunk``: ``deltanet_tpu.chunk_gla(q, k, v, g [B,T,H])``, the scalar decay per head, which it
  broadcasts over K itself; a ``g_gamma`` [] or [H] is broadcast to [B,T,H] (exact);
- ``gdn2.chunk``: ``deltanet_tpu.chunk_gdn2(q, k, v, g [B,T,HV,K], b [B,T,HV,K], w [B,T,HV,V])``, fla's argument
  names and maths. ``allow_neg_eigval`` (b drawn in [0, 2]) is passed as drawn: its docstring calls b "the
  activated erase gate in [0, 1]", but nothing clamps it (``stability_guard``, off by default, would clamp b >= 0
  only);
- ``use_qk_l2norm_in_kernel`` maps to its ``qk_l2norm`` (q and k normalised in float32, ``rsqrt(sum x² + 1e-6)``,
  fla's law).

Grouped value heads map as they are (q, k with H heads; v, the gates, the state with HV; value head j reads key
head ``j // (HV // H)``, fla's grouping). T need not be a multiple of 128: the library pads with tokens of no
decay, no erase and no write, which leave the state as it is.

Its chunk size is 128 whatever the case's ``C`` (fla's chunk size, at most 64): "Pallas TPU kernel requires
chunk_size=128". The legs chunk differently; the maths is the same.

Two candidates, one per documented ``precision``, as its users choose it:

- ``deltanet-tpu``: its default, ``precision="bf16"``: the matmuls take bf16 operands (one MXU pass), whatever the
  input dtype (an fp32 case too);
- ``deltanet-tpu-fp32``: ``precision="fp32"`` (``Precision.HIGHEST`` on float32 operands).

Packed sequences (``cu_seqlens``) map only where its semantics and fla's agree: its ``initial_state`` is one state
per batch row (B = 1 for a packing), applied to the first sequence, and its final state is the last sequence's;
it resets the state at each boundary. A packed case maps exactly when it passes no initial state and returns no
final state (``noht``), then ``cu_seqlens`` is passed as it is; any other packed case is refused with that reason.
An empty sequence is refused: it raises "cu_seqlens must be strictly monotonically increasing".

Refused, with the reason (an ``unsupported`` row): what the library's own checks reject, in its words (a
``ValueError`` raised by a ``raise`` line of its source, e.g. "Unsupported head dimensions (K=64, V=64); Pallas
TPU kernel requires K=128 and V=128."); the variants other than ``chunk`` (its decode steps, ``gdn_decode_step``
and the like, are one-token pure-JAX functions; fla's fused_recurrent and fused_chunk kernels are not what they
are); fla's in-kernel gate (``use_gate_in_kernel``: ``-exp(A_log) * softplus(g + dt_bias)``; its only in-kernel
law, ``fuse_prologue=True``, is ``-exp(min(g, 5.0))``); beta as logits (``use_beta_sigmoid_in_kernel``: its
sigmoid exists only inside ``fuse_prologue``, which also changes g's law); ``allow_neg_eigval``, ``lower_bound``,
``safe_gate``; the convolution in front (``conv1d``); g and g_gamma at once (only a rounding sum, made by the
binding, would reach its one gate); a missing install.

Not bound: ``chunk_delta_rule`` (gdn with g = 0: no harness op of its own) and the decode steps.

The leg forces interpret mode on every ``pallas_call`` itself; the library also picks interpret mode off a TPU
(``jax.default_backend() != "tpu"``), which the leg's compile answers as a TPU host would, so its kernels reach
Mosaic. The rows' ``kernels_traced`` / ``kernels_mosaic`` count its Pallas kernels, forward and backward (nothing
falls back to its pure-JAX ``fallback_scan``, which this binding never asks for).

Install (its metadata asks for Python >= 3.12 and jax 0.11; its modules import and run on 3.11 with jax 0.10.2):
``pip install --no-deps --ignore-requires-python deltanet-tpu==0.3.0``.
"""

from __future__ import annotations

import importlib.util

from harness.ops import gated
from harness.ops.base import LegBinding

from . import mapping

VERSION = "0.3.0"
INSTALL = f"pip install --no-deps --ignore-requires-python deltanet-tpu=={VERSION}"
CHUNK = 128
"""Its Pallas kernels' one chunk size ("Pallas TPU kernel requires chunk_size=128")."""

ENTRY = {"gdn": "chunk_gdn", "kda": "chunk_kda", "gla": "chunk_gla", "simple_gla": "chunk_gla", "gdn2": "chunk_gdn2"}
"""harness op -> the ``deltanet_tpu`` entry point its ``chunk`` variant maps onto."""


def _import():
    """The library, imported when this module is (outside any trace: docs/legs.md), and why not."""
    if importlib.util.find_spec("deltanet_tpu") is None:
        return None, f"deltanet-tpu is not installed ({INSTALL})"
    try:
        import deltanet_tpu

        return deltanet_tpu, None
    except Exception as exc:  # noqa: BLE001 - any import failure is the reason for every row
        return None, f"deltanet-tpu could not be imported: {type(exc).__name__}: {exc}"


_LIB, IMPORT_ERROR = _import()

REFUSED_OPTIONS = {
    "use_gate_in_kernel": ("it has no A_log/dt_bias gate: g is the activated log decay (its one in-kernel law, "
                           "fuse_prologue=True, is -exp(min(g, 5.0)), not fla's -exp(A_log) * softplus(g + dt_bias))"),
    "use_beta_sigmoid_in_kernel": ("beta is 'the activated gate in [0, 1]'; its sigmoid is applied only with "
                                   "fuse_prologue=True, which also changes g's law to -exp(min(g, 5.0))"),
    "allow_neg_eigval": "it has no allow_neg_eigval (beta in [0, 1]; gdn2's b is drawn in [0, 2] and maps)",
    "lower_bound": "it has no lower_bound (no in-kernel gate)",
    "safe_gate": "it has no safe_gate",
    "conv1d": "it has no convolution in front (conv1d)",
}

PACKED = ("its packed sequences (cu_seqlens) take one initial_state per batch row, applied to the first sequence "
          "only, and return the last sequence's final state: a packed case maps only without h0 and with noht")


def supports(case) -> str | None:
    """None to run the case, else why deltanet-tpu cannot take it."""
    if IMPORT_ERROR:
        return IMPORT_ERROR
    if case.variant != "chunk":
        return (f"deltanet-tpu has one chunked Pallas kernel (chunk_gdn2), bound to {case.op}.chunk; its decode "
                f"steps are one-token pure-JAX functions, not fla's {case.variant} kernels")
    given = [f"{name}: {why}" for name, why in REFUSED_OPTIONS.items() if case.opt.get(name)
             and not (case.op == "gdn2" and name == "allow_neg_eigval")]  # gdn2's: a draw of b, no keyword
    if given:
        return f"deltanet_tpu.{ENTRY[case.op]} takes no " + "; ".join(given)
    if case.op in ("gla", "simple_gla") and gated.both_gates(case):
        return (f"deltanet_tpu.chunk_gla takes one log decay g: g and g_gamma at once reach it only through a "
                f"rounding sum made by the binding")
    if case.cu_seqlens is not None:
        if any(n == 0 for n in mapping.requests(case)[1]):
            return ("an empty sequence in a packing raises in deltanet-tpu ('cu_seqlens must be strictly "
                    "monotonically increasing')")
        if case.h0 or case.final_state:
            return PACKED
    return None


def _gate(case, a):
    """The log decay ``g`` the entry point takes: the case's g, or its g_gamma broadcast over the tokens (exact)."""
    import jax.numpy as jnp

    if "g" in a:
        return a["g"]
    B, T, H = a["q"].shape[:3]
    if case.op == "gla":
        return gated.per_channel_gamma(a["g_gamma"], a["q"])
    return jnp.broadcast_to(gated.per_head_gamma(a["g_gamma"], H), (B, T, H))


def _call(fn, *args, **kwargs):
    """``fn(*args, **kwargs)``; the library's own input checks (a ValueError raised by a ``raise`` line of its
    source) become refusals in its words; anything else propagates (an ``error`` row)."""
    try:
        return fn(*args, **kwargs)
    except ValueError as exc:
        if not mapping.raised_by(exc, _LIB.__file__):
            raise
        raise NotImplementedError(f"deltanet-tpu refuses the case: {exc}") from None


def _forward(precision: str):
    def forward(case, a, ctx):
        import numpy as np

        del ctx  # the candidate leg forces interpret mode itself
        fn = getattr(_LIB, ENTRY[case.op])
        gates = ((_gate(case, a),) if case.op in ("gla", "simple_gla") else (a["g"], a["b"], a["w"])
                 if case.op == "gdn2" else (a["g"], a["beta"]))
        out = _call(fn, a["q"], a["k"], a["v"], *gates,
                    cu_seqlens=None if case.cu_seqlens is None else np.asarray(case.cu_seqlens, np.int32),
                    initial_state=a.get("h0"), output_final_state=case.final_state, chunk_size=CHUNK,
                    precision=precision, scale=case.resolved_scale,
                    qk_l2norm=bool(case.opt.get("use_qk_l2norm_in_kernel")))
        o, ht = out if case.final_state else (out, None)
        return {"o": o, "ht": ht}

    return forward


def _describe(precision: str):
    def describe(case) -> dict:
        out = {"entry": f"deltanet_tpu.{ENTRY.get(case.op, 'none')}",
               "precision": precision + (" (its default)" if precision == "bf16" else ""),
               "chunk_size": f"{CHUNK} (its only one; the case's C is fla's)",
               "ran_as": "Pallas (chunk_gdn2's kernels; backward: its custom_vjp's Pallas kernels)"}
        shape = gated.gamma_shape(case) if case.op in ("gla", "simple_gla") else None
        if shape is not None:
            out["gate_mapping"] = f"g_gamma [{shape}] broadcast to g {'[B,T,H,K]' if case.op == 'gla' else '[B,T,H]'} (exact)"
        if case.cu_seqlens is not None:
            out["packed"] = "cu_seqlens as it is (no h0, no final state: its semantics and fla's agree)"
        return out

    return describe


class DeltanetTpu:
    """The implementation object (:mod:`harness.legs.external`), at one ``precision``."""

    distribution = "deltanet-tpu"  # the rows' version: deltanet-tpu's, not this project's (which ships the binding)

    def __init__(self, precision: str):
        self.precision = precision
        binding = LegBinding(_forward(precision), supports, describe=_describe(precision))
        self.bindings = {op: binding for op in ENTRY}


IMPLEMENTATION = DeltanetTpu("bf16")
FP32 = DeltanetTpu("fp32")
