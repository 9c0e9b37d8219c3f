"""jax-linear-attention 0.1.0 (PyPI, Apache-2.0, import name ``jla``) as a candidate: its Pallas **Mosaic GPU**
kernels for Hopper (sm_90) on simple_gla, gla, gdn, kda and gdn2, forward and backward (each kernel's
``custom_vjp``), measured against fla on the same GPU.

It is not a TPU library: its kernels are built for a Hopper GPU and nothing here can run them elsewhere. The binding
declares ``platform = "gpu"`` (:data:`harness.legs.external.PLATFORMS`): the candidate leg runs it natively where
jax has a GPU, with no interpret mode, no MXU model and no TPU compile, and refuses every case on any other machine.
The binding refuses too, first, and says more (:func:`off_hopper`): off an sm_90 GPU every case is ``unsupported``
with what it needs, and with the fact a user must know: its public entry point's default, ``impl="auto"``, would
run here anyway, silently, as plain JAX (``jla.ops.chunked``, or the token-by-token ``reference``), since each
kernel's ``supports`` predicate turns a non-Hopper device away. That check imports nothing of ``jla``: the library
asks for Python >= 3.12 and jax == 0.11.2 and does not install on this project's 3.11 / jax 0.10.2 stack.

**The call.** Its one public entry point, ``jla.ops.linear_attention(kind, q, k, v, impl="mosaic_gpu", **inputs)``,
with the Mosaic GPU implementation named (its ``"auto"`` is never used). Named, it runs the kernel registered for
the kind or raises: its kernels check their inputs and raise ``ValueError("mosaic_gpu <kind>: <reason>")``, and with
no Mosaic GPU toolchain in jax nothing is registered and it raises "no 'mosaic_gpu' implementation". A ValueError
from a ``raise`` line of ``jla`` becomes a refusal in its words (:func:`peers.mapping.raised_by`); anything else is
an ``error`` row. Tensors as the harness draws them, FLA's layout, which is its own (q, k ``[B, T, H, K]``, v
``[B, T, HV, V]``, states K-first ``[B, HV, K, V]``, g the natural-log decay): ``scale=case.resolved_scale``,
``initial_state=h0``, ``output_final_state``; the chunk size is its default (64; the legs chunk differently, the
maths is the same):

- ``simple_gla.chunk``: kind ``simple_gla``, ``g [B, T, HV]``; a ``g_gamma`` ([] or [H]) broadcast to it (exact);
- ``gla.chunk``: kind ``gla``, ``g [B, T, H, K]`` (its default ``pipeline="gla"``, the dedicated kernels); a
  ``g_gamma`` of any form broadcast to it (exact);
- ``gdn.chunk``: kind ``gated_deltanet`` (``g [B, T, HV]``, ``beta [B, T, HV]``);
- ``kda.chunk``: kind ``kda`` (``g [B, T, HV, K]``, ``beta``);
- ``gdn2.chunk``: kind ``gdn2`` (``g``, ``b [B, T, H, K]``, ``w [B, T, H, V]``: fla's names and maths, Eq. 10 of the
  GDN-2 paper in its docstring);
- ``use_qk_l2norm_in_kernel`` maps to its ``use_qk_l2norm`` (gdn, kda, gdn2);
- packed sequences map to its ``segment_ids [B, T]`` (it takes no ``cu_seqlens``: "the kernels take segment_ids,
  not cu_seqlens"), a sequence's index on each of its tokens, where the two agree: its recurrence restarts from zero
  at each change of id and it has one state per batch row, so a packed case maps without h0 and with noht.

Grouped value heads go as they are (value head j reads key head ``j // (HV // H)``, fla's grouping, as its
``simple_gla`` and ``gated_deltanet`` kernels group); its kda, gla and gdn2 kernels check ``v.shape[:3] ==
q.shape[:3]`` and refuse them in their words. Its dtype and shape rules are its own checks, in its words on a GPU
(simple_gla and gdn: bf16 or fp16 q, k, v; kda, gla, gdn2: bf16; K and V in {64, 128}; ``H * K`` a multiple of 128
for the vector-gate kernels).

Refused, with the reason: off an sm_90 GPU, every case (above); the variants other than ``chunk`` (its kernels are
chunked; it has no decode kernel); fla's in-kernel gate (``use_gate_in_kernel``), beta as logits
(``use_beta_sigmoid_in_kernel``), ``allow_neg_eigval`` (gdn, kda), ``lower_bound``, ``safe_gate`` and the
convolution in front (``conv1d``: its ``short_conv`` is a layer, not an option of this call); g and g_gamma at once
(one gate reaches it); a packed case with h0 or a final state; a missing install.

Install, on a machine with an H100 (Python 3.12): ``pip install 'jax-linear-attention[cuda]==0.1.0'``
(jax[cuda13] 0.11.2). ``reports/peers/jax-linear-attention/README.md`` gives the command that gates it.
"""

from __future__ import annotations

from harness.ops import gated
from harness.ops.base import LegBinding

from . import mapping

DISTRIBUTION = "jax-linear-attention"
VERSION = "0.1.0"
INSTALL = f"on Python >= 3.12 with an H100: pip install '{DISTRIBUTION}[cuda]=={VERSION}'"
ENTRY = "jla.ops.linear_attention"

KINDS = {"simple_gla": "simple_gla", "gla": "gla", "gdn": "gated_deltanet", "kda": "kda", "gdn2": "gdn2"}
"""harness op -> its ``kind`` (``jla.ops.KINDS``)."""

GATES = {"simple_gla": ("g",), "gla": ("g",), "gdn": ("g", "beta"), "kda": ("g", "beta"), "gdn2": ("g", "b", "w")}
"""harness op -> the gate inputs its kind takes, by name (the harness's names are its own)."""

DELTA = ("gdn", "kda", "gdn2")
"""The ops whose kind takes ``use_qk_l2norm``."""

REFUSED_OPTIONS = {
    "use_gate_in_kernel": "it has no A_log/dt_bias gate: g is the log decay itself",
    "use_beta_sigmoid_in_kernel": "beta is taken as given (no sigmoid in the call)",
    "lower_bound": "it has no lower_bound (no in-kernel gate)",
    "safe_gate": "it has no safe_gate",
    "conv1d": "no convolution in front (its short_conv is a layer of its own, not an option of this call)",
}

PACKED = ("its packed sequences are segment_ids [B, T] (no cu_seqlens): the recurrence restarts from zero at each "
          "change of id, with one initial and one final state per batch row; a packed case maps only without h0 "
          "and with noht")


def off_hopper() -> str | None:
    """Why its kernels cannot run on this machine (None on an sm_90 GPU), without importing ``jla``."""
    import jax

    backend = jax.default_backend()
    if backend != "gpu":
        here = f"jax's default backend here is {backend!r}"
    else:
        device = jax.devices()[0]
        capability = getattr(device, "compute_capability", None)
        if capability == "9.0":
            return None
        here = f"the GPU here is {device.device_kind} (compute capability {capability})"
    return (f"jax-linear-attention's kernels are Pallas Mosaic GPU kernels for an sm_90 (Hopper) GPU and {here}; "
            f"its default impl='auto' would run plain JAX here (jla.ops.chunked), silently, not its kernels")


_LIB, IMPORT_ERROR = mapping.import_provided("jla.ops", DISTRIBUTION, INSTALL, ("jla",))


def supports(case) -> str | None:
    """None to run the case, else why its Mosaic GPU kernels cannot take it (the machine first: no import)."""
    why = off_hopper()
    if why:
        return why
    if IMPORT_ERROR:
        return IMPORT_ERROR
    if case.variant != "chunk":
        return (f"its Mosaic GPU kernels are chunked ({ENTRY}(kind, ..., impl='mosaic_gpu')) and it has no decode "
                f"kernel: fla's {case.op}.{case.variant} does not map")
    refused = dict(REFUSED_OPTIONS)
    if case.op in ("gdn", "kda"):
        refused["allow_neg_eigval"] = "it has no allow_neg_eigval (beta in [0, 1])"
    why = mapping.refused_options(case, f"{ENTRY}({KINDS[case.op]!r}, ..., impl='mosaic_gpu')", refused)
    if why:
        return why
    if case.op in ("gla", "simple_gla") and gated.both_gates(case):
        return f"its {case.op} takes one log decay g: g and g_gamma at once reach it only through a rounding sum"
    if case.cu_seqlens is not None and (case.h0 or case.final_state):
        return PACKED
    return None


def _gate(case, a):
    """The log decay ``g`` its kind takes: the case's, or its g_gamma broadcast over the tokens (exact)."""
    import jax.numpy as jnp

    if "g" in a:
        return a["g"]
    if case.op == "gla":
        return gated.per_channel_gamma(a["g_gamma"], a["q"])
    B, T = a["q"].shape[:2]
    HV = a["v"].shape[2]
    return jnp.broadcast_to(gated.per_head_gamma(a["g_gamma"], HV), (B, T, HV))


def segment_ids(case):
    """Its ``segment_ids [1, T]`` of a packed case: each token's sequence index (an empty sequence has none)."""
    import numpy as np

    _, lengths = mapping.requests(case)
    return np.repeat(np.arange(len(lengths), dtype=np.int32), lengths)[None]


def forward(case, a, ctx):
    del ctx  # never interpreted: its platform is "gpu" (the leg runs it natively or not at all)
    inputs = {name: a[name] for name in GATES[case.op] if name != "g"}
    inputs["g"] = _gate(case, a)
    if case.cu_seqlens is not None:
        inputs["segment_ids"] = segment_ids(case)
    if case.op in DELTA and case.opt.get("use_qk_l2norm_in_kernel"):
        inputs["use_qk_l2norm"] = True
    try:
        o, ht = _LIB.linear_attention(KINDS[case.op], a["q"], a["k"], a["v"], impl="mosaic_gpu",
                                      scale=case.resolved_scale, initial_state=a.get("h0"),
                                      output_final_state=case.final_state, **inputs)
    except ValueError as exc:  # its own input checks, in its words; anything else is an error row
        if not mapping.raised_by(exc, _LIB.__file__):  # jla/ops/: its entry point and its kernels' checks
            raise
        raise NotImplementedError(f"jax-linear-attention refuses the case: {exc}") from None
    return {"o": o, "ht": ht if case.final_state else None}


def describe(case) -> dict:
    out = {"entry": f"{ENTRY}({KINDS.get(case.op)!r}, q, k, v, impl='mosaic_gpu', "
                    f"{', '.join(GATES.get(case.op, ()))}, ...)",
           "ran_as": "Pallas Mosaic GPU (Hopper), natively; backward: its custom_vjp's kernels",
           "chunk_size": "64, its default (the case's C is fla's)"}
    shape = gated.gamma_shape(case) if case.op in ("gla", "simple_gla") else None
    if shape is not None:
        out["gate_mapping"] = f"g_gamma [{shape}] broadcast to g (exact)"
    if case.cu_seqlens is not None:
        out["packed"] = "segment_ids [1, T], each token's sequence index (no h0, no final state)"
    return out


class JaxLinearAttention:
    """The implementation object (:mod:`harness.legs.external`)."""

    distribution = DISTRIBUTION  # the rows' version: its own, not this project's (which ships the binding)
    platform = "gpu"  # Mosaic GPU kernels: native on a GPU, refused elsewhere (harness.legs.external.PLATFORMS)
    bindings = {op: LegBinding(forward, supports, describe=describe) for op in KINDS}


IMPLEMENTATION = JaxLinearAttention()
