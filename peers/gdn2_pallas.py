"""gdn2-pallas 0.1.1 (PyPI, MIT, import name ``atomic_ops``) as candidates: its Pallas TPU kernels for Gated
DeltaNet-2 on op ``gdn2``, forward and backward (its ``custom_vjp``).

**What a user calls, and what runs.** Its public entry point ``atomic_ops.gdn2_forward_trainable(q, k, v, w, b,
g, scale, h0=None, config=None)`` dispatches (``atomic_ops/fallback.py``): on a TPU (``is_tpu_available()``, i.e.
``jax.devices("tpu")`` answers) with ``d_head == 128`` it calls ``gdn2_pallas_forward_trainable(..., config=
DEFAULT_CONFIG)``; anywhere else it runs ``gdn2_chunked_wy_reference``, a pure-JAX ``lax.scan``, and says nothing.
On this CPU it would therefore hand the candidate leg its pure-JAX reference, while the leg's TPU compile (whose
runtime answers as a TPU host's) would trace and count the Pallas path: numbers from one program, kernel counts
from another. Each candidate here calls the forced-Pallas entry ``gdn2_pallas_forward_trainable`` with the config
it names, which is the call the public entry makes on a TPU at ``d_head = 128``
(``tests/test_peer_gdn2_pallas.py`` checks that both trace the same program there, and that off a TPU the public
one traces no kernel). The rows' ``kernels_traced`` / ``kernels_mosaic`` are the kernels that ran: forward A
(scores), B (WY block solve), C (recompute), backward B2, B3, B4 (6 in all); its inter-chunk scan (D), dh
pass (B1) and reverse cumsum (B5) are jax outside the kernels. Where the public entry would fall back on a TPU
too (``d_head != 128``), the forced entry raises, and the case is refused in its words ("Kernels assume
d_head=128 (MXU tile); got D=64.").

**Candidates**, one per config that changes the numbers (``KernelConfig(bt, bc, mb, clip, wy_eps)``):

- ``gdn2-pallas``: ``DEFAULT_CONFIG`` = ``KAGGLE_MEDIUM`` (bt 256, bc 128, mb 16, clip 1e4, wy_eps 1e-3), what
  ``config=None`` gives. ``wy_eps`` damps the WY solve: its strictly lower ``Akk`` is scaled by ``1 - wy_eps``
  before the inversion, so the kernels solve ``(I + 0.999 A)`` where GDN-2 has ``(I + A)``;
- ``gdn2-pallas-small``: ``KAGGLE_SMALL`` (bt 128, bc 64, wy_eps 1e-3), what its ``get_recommended_config``
  returns for every shape under about 2.5 GB (every case of this harness) and what its training example uses;
- ``gdn2-pallas-undamped``: ``KernelConfig()``, the dataclass's own defaults (bt 256, wy_eps 0.0): the exact
  solve, its README's "optional wy_eps damping" left off.

``KAGGLE_LARGE`` differs from ``KAGGLE_MEDIUM`` only in ``clip`` (5e3 for 1e4), which no value of a harness case
reaches: not bound. Every config clips and ``nan_to_num``s at each kernel boundary (``sanitize``), and the score
kernel clamps each decay difference to [-20, 20] before its ``exp``; neither is optional.

**Mapping.** fla's gdn2 and the library agree on the maths: ``b`` the erase gate on the key (``b * k``), ``w``
the write gate on the value (``w * v``), ``g`` the per-channel log decay, ``h0`` K-first ``[B, H, K, V]``; the
library takes them as ``(q, k, v, w, b, g, scale, h0)``, every tensor ``(batch, seq_len, heads, d_head)``. They
are passed as the harness draws them (q, k, v, b, w in the case dtype; g and h0 in float32),
``scale=case.resolved_scale``. Without ``h0`` it starts from zeros, as fla. Its chunk is ``bt`` whatever the
case's C (fla's, 64): the legs chunk differently, the function is the same.

**Output dtype.** ``o`` comes back float32 whatever the input dtype (its inter-chunk scan runs in float32 and
the forward never casts back); gradients come back in their inputs' dtypes. As the tpu-inference and sglang-jax
bindings do, ``o`` is cast to the case dtype (round to nearest), the dtype the harness declares and compares
it in, so that the comparison never credits it with precision a bf16 ``o`` cannot hold; ``describe`` records
the dtype it returned.

Refused, with the reason (an ``unsupported`` row): what its own checks reject, in its words (a ``ValueError``
raised by a ``raise`` line of ``atomic_ops``: ``d_head`` other than 128, ``seq_len`` not a multiple of ``bt``,
``v`` not of q's shape, i.e. K != V); the decode variant (no decode kernel: its ``gdn2_token_serial_reference``
is a pure-JAX scan); packed sequences (no ``cu_seqlens``; one ``h0`` per batch row); fla's in-kernel options
(``use_qk_l2norm_in_kernel``, ``use_gate_in_kernel`` with ``A_log``/``dt_bias``/``lower_bound``,
``safe_gate``) and the convolution in front (``conv1d``), none of which it has; ``atomic_ops`` provided by
another distribution (atomic-ops installs a package of the same name: ``peers/atomic_ops.py``); a missing
install.

Interpret mode: it has no flag (its kernel A and B4 take ``interpret=False`` and are never passed one); the
candidate leg forces interpret mode on every ``pallas_call``, and its TPU compile lowers them as built.

Install: ``pip install --no-deps gdn2-pallas==0.1.1`` (it needs jax, jaxlib, numpy, already here). It cannot
share an environment with atomic-ops (both wheels install ``atomic_ops``; the last one installed wins).
"""

from __future__ import annotations

from harness.ops.base import LegBinding

from . import mapping

DISTRIBUTION = "gdn2-pallas"
VERSION = "0.1.1"
INSTALL = f"pip install --no-deps {DISTRIBUTION}=={VERSION}"
ENTRY = "atomic_ops.gdn2_pallas_forward_trainable"
PUBLIC = "atomic_ops.gdn2_forward_trainable"
KERNELS = {"forward": ("A scores", "B WY block solve", "C recompute"), "backward": ("B2", "B3", "B4")}
"""Its pallas_calls, by the names its source gives their stages (the kernels themselves are unnamed lambdas)."""


_LIB, IMPORT_ERROR = mapping.import_provided("atomic_ops", DISTRIBUTION, INSTALL)  # outside any trace: docs/legs.md

REFUSED_OPTIONS = {
    "use_qk_l2norm_in_kernel": "it takes q and k as given (no l2norm)",
    "use_gate_in_kernel": "g is the log decay itself ('keep g <= 0'): it has no A_log/dt_bias gate",
    "safe_gate": "it has no safe_gate",
    "conv1d": "it has no convolution in front (conv1d)",
}


def supports(case) -> str | None:
    """None to run the case, else why gdn2-pallas cannot take it (before anything is traced)."""
    if IMPORT_ERROR:
        return IMPORT_ERROR
    if case.variant != "chunk":
        return (f"gdn2-pallas has no {case.variant} kernel: its one Pallas path is chunked "
                f"({ENTRY}); its token-serial reference is a pure-JAX scan, not a decode kernel")
    why = mapping.refused_options(case, ENTRY, REFUSED_OPTIONS)
    if why:
        return why
    if case.cu_seqlens is not None:
        return (f"{ENTRY} takes no packed sequences: its tensors are (batch, seq_len, heads, d_head), with one h0 "
                f"per batch row")
    return None


def _call(fn, *args, **kwargs):
    """``fn(*args, **kwargs)``; its own input checks (a ValueError raised by a ``raise`` line of ``atomic_ops``)
    become refusals in its words; anything else propagates (an ``error`` row)."""
    try:
        return fn(*args, **kwargs)
    except ValueError as exc:
        if not mapping.raised_by(exc, _LIB.__file__):
            raise
        raise NotImplementedError(f"gdn2-pallas refuses the case: {exc}") from None


def _forward(preset: str):
    def forward(case, a, ctx):
        del ctx  # the candidate leg forces interpret mode itself; the library has no flag
        config = getattr(_LIB, preset) if preset != "KernelConfig()" else _LIB.KernelConfig()
        o, ht = _call(_LIB.gdn2_pallas_forward_trainable, a["q"], a["k"], a["v"], a["w"], a["b"], a["g"],
                      case.resolved_scale, h0=a.get("h0"), config=config)
        return {"o": o.astype(a["q"].dtype), "ht": ht if case.final_state else None}

    return forward


def _describe(preset: str):
    def describe(case) -> dict:
        out = {"entry": f"{ENTRY}(config={preset})",
               "public_entry": (f"{PUBLIC} calls this on a TPU when d_head == 128"
                                + (" (config=None)" if preset == "DEFAULT_CONFIG" else f" (config={preset})")
                                + "; elsewhere its pure-JAX gdn2_chunked_wy_reference"),
               "ran_as": ("Pallas: forward kernels " + ", ".join(KERNELS["forward"]) + "; backward "
                          + ", ".join(KERNELS["backward"]) + " (its inter-chunk scan D, dh pass B1 and reverse "
                          "cumsum B5 are jax)"),
               "o_dtype": f"float32 returned, cast to {case.dtype}"}
        if _LIB is not None:
            config = getattr(_LIB, preset) if preset != "KernelConfig()" else _LIB.KernelConfig()
            out["config"] = {name: getattr(config, name) for name in ("bt", "bc", "mb", "clip", "wy_eps")}
        return out

    return describe


class Gdn2Pallas:
    """The implementation object (:mod:`harness.legs.external`), at one of its configs."""

    distribution = DISTRIBUTION  # the rows' version: gdn2-pallas's, not this project's (which ships the binding)

    def __init__(self, preset: str):
        self.preset = preset
        self.bindings = {"gdn2": LegBinding(_forward(preset), supports, describe=_describe(preset))}


IMPLEMENTATION = Gdn2Pallas("DEFAULT_CONFIG")
SMALL = Gdn2Pallas("KAGGLE_SMALL")
UNDAMPED = Gdn2Pallas("KernelConfig()")
