"""ejkernel (PyPI, Apache-2.0; EasyDeL's kernel library) as a candidate: its Pallas TPU ``gated_delta_rule`` on gdn,
forward and backward.

The entry point is the one ejkernel's kernel registry holds for the Pallas platform on TPU,
``ejkernel.kernels._pallas.tpu.gated_delta_rule.gated_delta_rule(query, key, value, beta, decay, *, chunk_size=256,
initial_state, use_qk_l2norm=True)``: what its public operation (``ejkernel.modules.operations.gated_delta_rule``)
dispatches to on a TPU, bound here directly because the operation autotunes on a cache miss (it times candidate
chunk sizes, 10 warm-up and 40 timed runs each) and, for one token from a carried state, bypasses the registry for an
XLA step. It computes, for every path, in its own dtype plan: q, k, v, beta and the log decay are cast to the input
dtype (bf16 for a bf16 case: the float32 gate is rounded to bf16), and it returns the final state in the input dtype.

What runs, by the case's shape (the rows' ``details.ran_as`` says which):

- T > 1: **XLA, not Pallas.** Its Pallas ``_chunk_gdr_fwd`` is documented "Multi-token training/prefill is routed
  through the XLA recurrent implementation (``_recurrent_gdr_fwd``) for numerical stability": pure JAX, a chunked
  WY form with ``solve_triangular`` and a ``lax.scan`` over chunks, its dots at ``Precision.HIGHEST``. The rows'
  ``kernels_traced`` are 0: no Pallas kernel ran, and this binding declares that path pure JAX;
- T = 1 with an initial state (a decode step, per batch row): its Pallas single-step kernel
  (``_single_step_gdr_fwd``, a ``custom_vjp`` whose backward is a Pallas kernel too).

Gradients on the XLA path come from jax's autodiff through its dots (``Precision.HIGHEST``) and its
``solve_triangular``; the candidate leg's MXU model differentiates each dot as a TPU does, its cotangent dots modeled
at the dot's precision (``harness.legs.external.modeled_dot_p``; ``tests/test_peer_ejkernel.py -m heavy``). Before
2026-11-28 the model gave them zero, then raised "Transpose rule ... for 'custom_vjp_call' not implemented": the
model's holes, not ejkernel's (reports/bisect/ejkernel).

A release without :data:`MODULE` (0.0.60 to 0.0.71) refuses every case, saying which gated_delta_rule it has;
``parity bisect`` marks it ``unsupported`` with that reason.

The mapping: gdn's g is its ``decay`` [B,T,H] (a log decay), beta its ``beta``; ``h0`` its ``initial_state``
([B,H,K,V], K-first as here); ``use_qk_l2norm`` is the case's ``use_qk_l2norm_in_kernel`` (its default is True;
this binding passes the case's); its chunk size its default, 256 (the case's ``C`` is fla's). Bound to both of
gdn's variants: ``chunk`` (the prefill: XLA) and ``fused_recurrent`` (fla's decode kernel: one token from h0 runs its
Pallas step).

Refused, with the reason: grouped value heads (one ``num_heads`` for q, k, v, beta and decay); a scale other than
K**-0.5 (it scales q by ``1 / sqrt(qk_head_dim)`` itself and takes no scale); packed sequences (its words: "Pallas
GDR does not support sequence packing (seg_ids); the packed path uses the XLA backend."); fla's in-kernel gate,
beta as logits, ``allow_neg_eigval`` and the convolution in front (none of them in its signature); kda (its ``kda``
operation has one decay per head, gdn's maths, not fla's per-channel kda); a missing install.

Importing ejkernel sets jax's persistent compilation cache (``jax_compilation_cache_dir``, its ``ejit``): a later
compile of any program in the process could be served from disk, skipping what the harness reads from a compile
(the Mosaic kernels, the MXU passes). This binding restores jax's setting after the import.

Install, keeping jax as it is (``jax ~= 0.10`` in its metadata, satisfied here; its dependencies one by one):
``pip install --no-deps ejkernel==0.0.80.3 beartype==0.23.1 chex==0.1.92 jaxtyping==0.3.11 wadler-lindig==0.1.8
pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.8.0 typing-inspection==0.4.5 toolz==1.2.0 absl-py==2.5.1``
(einops, tqdm and typing-extensions are this project's already).
"""

from __future__ import annotations

import importlib.util

from harness.ops.base import LegBinding

from . import mapping

VERSION = "0.0.80.3"
INSTALL = (f"pip install --no-deps ejkernel=={VERSION} beartype==0.23.1 chex==0.1.92 jaxtyping==0.3.11 "
           "wadler-lindig==0.1.8 pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.8.0 "
           "typing-inspection==0.4.5 toolz==1.2.0 absl-py==2.5.1")
ENTRY = "ejkernel.kernels._pallas.tpu.gated_delta_rule.gated_delta_rule"


MODULE = "ejkernel.kernels._pallas.tpu.gated_delta_rule"
"""Where ejkernel keeps its Pallas TPU gated_delta_rule (the module that registers it for the Pallas platform)."""


def missing_kernel() -> str:
    """Why a release without :data:`MODULE` maps no case, in its own terms: which gated_delta_rule it has, if any
    (0.0.60 has none; 0.0.71 registers one for ``Platform.XLA`` only, ``ejkernel.kernels._xla.gated_delta_rule``)."""
    import importlib.metadata

    version = importlib.metadata.version("ejkernel")
    has_xla = importlib.util.find_spec("ejkernel.kernels._xla.gated_delta_rule") is not None
    return (f"ejkernel {version} has no Pallas TPU gated_delta_rule: no module {MODULE} in its kernel registry ("
            + ("its gated_delta_rule is registered for Platform.XLA only)" if has_xla else
               "nor any gated_delta_rule kernel)"))


def _import():
    """The entry point, imported when this module is (outside any trace), jax's compilation-cache setting kept as
    it was; and why not."""
    if importlib.util.find_spec("ejkernel") is None:
        return None, f"ejkernel is not installed ({INSTALL})"
    import jax

    kept = jax.config.jax_compilation_cache_dir
    try:
        if importlib.util.find_spec(MODULE) is None:  # not a failure of the import: this release has no such kernel
            return None, missing_kernel()
        from ejkernel.kernels._pallas.tpu.gated_delta_rule import gated_delta_rule

        return gated_delta_rule, None
    except Exception as exc:  # noqa: BLE001 - any import failure is the reason for every row
        return None, f"ejkernel could not be imported: {type(exc).__name__}: {exc}"
    finally:
        if jax.config.jax_compilation_cache_dir != kept:
            from jax.experimental.compilation_cache import compilation_cache

            jax.config.update("jax_compilation_cache_dir", kept)
            compilation_cache.reset_cache()


ENTRY, IMPORT_ERROR = _import()

REFUSED_OPTIONS = {
    "use_gate_in_kernel": "no A_log/dt_bias gate (decay is the log decay itself)",
    "use_beta_sigmoid_in_kernel": "beta as given (no sigmoid)",
    "allow_neg_eigval": "no allow_neg_eigval",
    "conv1d": "no convolution in front",
}


def supports(case) -> str | None:
    if IMPORT_ERROR:
        return IMPORT_ERROR
    if case.op != "gdn":
        return (f"ejkernel's Pallas gated_delta_rule is gdn's maths (one decay per head); {case.op} does not map "
                f"(its kda operation has one decay per head too, not fla's per-channel gate)")
    given = [f"{name} ({why})" for name, why in REFUSED_OPTIONS.items() if case.opt.get(name)]
    if given:
        return "ejkernel's gated_delta_rule takes " + "; ".join(given)
    if case.HV != case.H:
        return ("ejkernel's gated_delta_rule takes one num_heads for q, k, v, beta and decay: no grouped value heads "
                f"(this case has H={case.H}, HV={case.HV})")
    if case.scale is not None and case.scale != case.K ** -0.5:
        return f"ejkernel's gated_delta_rule scales q by 1/sqrt(K) itself (no scale argument); this case sets {case.scale}"
    if case.cu_seqlens is not None:
        return ("ejkernel refuses packed sequences on this path: 'Pallas GDR does not support sequence packing "
                "(seg_ids); the packed path uses the XLA backend.'")
    return None


def _pallas_step(case) -> bool:
    """Whether the case runs its Pallas single-step kernel (one token from a carried state), not its XLA path."""
    return case.T == 1 and bool(case.h0)


def forward(case, a, ctx):
    del ctx  # the candidate leg forces interpret mode itself
    try:
        o, ht = ENTRY(a["q"], a["k"], a["v"], a["beta"], a["g"], initial_state=a.get("h0"),
                       use_qk_l2norm=bool(case.opt.get("use_qk_l2norm_in_kernel")))
    except (ValueError, NotImplementedError) as exc:
        import ejkernel

        if not mapping.raised_by(exc, ejkernel.__file__):
            raise
        raise NotImplementedError(f"ejkernel refuses the case: {exc}") from None
    return {"o": o, "ht": ht if case.final_state else None}


def describe(case) -> dict:
    out = {"entry": ENTRY, "chunk_size": "256 (its default; the case's C is fla's)",
           "dtypes": "q, k, v, beta, decay cast to the input dtype; the final state returned in it"}
    if _pallas_step(case):
        out["ran_as"] = "Pallas: its single-step kernel (T = 1 from a carried state), backward a Pallas kernel too"
    else:
        out["ran_as"] = ("XLA, 0 Pallas kernels: for T > 1 its Pallas gated_delta_rule routes to _recurrent_gdr_fwd "
                         "(pure JAX), declared here")
    return out


class Ejkernel:
    """The implementation object (:mod:`harness.legs.external`)."""

    distribution = "ejkernel"  # the rows' version: ejkernel's, not this project's (which ships the binding)
    bindings = {"gdn": LegBinding(forward, supports, describe=describe)}


IMPLEMENTATION = Ejkernel()
