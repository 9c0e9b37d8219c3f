"""vLLM's TPU backend (``tpu-inference`` on PyPI) as a candidate: its ``fused_gdn`` Pallas kernel on gdn and kda.

``tpu_inference.kernels.gdn.v1.fused_gdn_kernel_wrapper.fused_gdn`` is a forward kernel for the gated delta
rule family, serving packed requests from a state cache: gdn's scalar decay per head ([T, H_v], which it
broadcasts over K) and kda's per-channel gate ([T, H_v, K]). This binding maps a gdn or a kda case onto it:

- the batch rows (or the case's packed sequences) become requests: tokens ``[T_total, H, K]`` with
  ``cu_seqlens``. With ``h0``, the leading one-token sequences are decode requests (its decode kernel: one
  token on a carried state) and the rest prefill (``distribution = (decode_end, N)``); without, all prefill;
- grouped value heads map as they are: q and k keep their ``H`` heads, v, the gate, beta and the state have
  ``HV`` (its ``H_qk`` and ``H_v``; it repeats q and k to the value heads itself);
- ``h0`` is the state cache ``[N, HV, K, V]`` (``state_indices = 0..N-1``; ``has_initial_state`` False
  without h0, which zeroes each slot in the kernel); the cache it returns is ``ht``;
- ``b`` takes beta's logits (the kernel applies the sigmoid), so only cases with
  ``use_beta_sigmoid_in_kernel`` map exactly; ``use_qk_l2norm_in_kernel`` maps to its option of the same name;
- gdn's in-kernel gate maps exactly: ``-exp(A_log) * softplus(g + dt_bias)`` with ``A_log`` and ``dt_bias`` per
  value head, fla's law and its own without ``lower_bound``.

It refuses, with the reason, what does not map: beta given as probabilities, ``allow_neg_eigval``, kda's
in-kernel gate (its ``dt_bias`` is per head, fla's kda per channel). Its own input checks (for example bf16
heads in pairs) are refusals too. Forward only: the kernel has no backward.

Install it without vLLM and without a second jax (its wheel pins jax 0.11.2 and vLLM's stack):
``pip install --no-deps tpu-inference``. Its package ``__init__`` imports vLLM; the kernel modules import
only jax, so this binding loads them without running that ``__init__``.
"""

from __future__ import annotations

import importlib.util
import sys

from harness.ops.base import LegBinding

KERNEL = "tpu_inference.kernels.gdn.v1.fused_gdn_kernel_wrapper"
INSTALL = "pip install --no-deps tpu-inference"


def _kernel():
    """``fused_gdn``, imported without running ``tpu_inference/__init__.py`` (which imports vLLM)."""
    if "tpu_inference" not in sys.modules:
        spec = importlib.util.find_spec("tpu_inference")
        if spec is None:
            raise NotImplementedError(f"tpu-inference is not installed ({INSTALL})")
        sys.modules["tpu_inference"] = importlib.util.module_from_spec(spec)  # its __init__ is never executed
    return importlib.import_module(KERNEL).fused_gdn


def _refusal(case) -> str | None:
    """What no gated-delta-rule case can map: a missing install, beta as probabilities, allow_neg_eigval."""
    if importlib.util.find_spec("tpu_inference") is None:
        return f"tpu-inference is not installed ({INSTALL})"
    opt = case.opt
    if not opt.get("use_beta_sigmoid_in_kernel"):
        return ("fused_gdn takes beta as logits (b, the sigmoid inside the kernel); this case gives beta itself "
                "(cases with use_beta_sigmoid_in_kernel=1 map exactly)")
    if opt.get("allow_neg_eigval"):
        return "fused_gdn has no allow_neg_eigval"
    return None


def supports_kda(case) -> str | None:
    """:func:`_refusal`, and kda's in-kernel gate, whose dt_bias fla takes per channel."""
    if case.opt.get("use_gate_in_kernel"):
        return _refusal(case) or ("fused_gdn's in-kernel gate takes dt_bias per head [H]; fla's kda takes it per "
                                  "channel [H*K]")
    return _refusal(case)


def forward(case, a, ctx):
    import jax.numpy as jnp

    del ctx  # the candidate leg forces interpret mode itself
    fused_gdn = _kernel()
    B, T, _, K = a["q"].shape  # q, k keep their H heads: fused_gdn repeats them to v's HV itself
    HV, V = a["v"].shape[2:]
    offsets = case.cu_seqlens if case.cu_seqlens is not None else tuple(range(0, B * T + 1, T))
    N = len(offsets) - 1

    def tokens(x):
        return x.reshape((B * T,) + x.shape[2:])

    h0 = a.get("h0")
    lengths = [b - a_ for a_, b in zip(offsets, offsets[1:])]
    decode_end = 0 if h0 is None else next((i for i, n in enumerate(lengths) if n != 1), N)
    cache = jnp.zeros((N, HV, K, V), jnp.float32) if h0 is None else jnp.array(h0, jnp.float32)  # a copy: donated
    gate = {}
    if case.opt.get("use_gate_in_kernel"):  # gdn's law, per value head (supports_kda refuses kda's)
        gate = dict(use_gate_in_kernel=True, A_log=jnp.asarray(a["A_log"], jnp.float32),
                    dt_bias=jnp.asarray(a["dt_bias"], jnp.float32))
    try:
        o, ht = fused_gdn(tokens(a["q"]), tokens(a["k"]), jnp.array(tokens(a["v"])),
                          jnp.asarray(offsets, jnp.int32), tokens(a["g"]).astype(jnp.float32), cache,
                          jnp.arange(N, dtype=jnp.int32), jnp.asarray((decode_end, N), jnp.int32), tokens(a["beta"]),
                          jnp.full((N,), h0 is not None), scale=case.resolved_scale,
                          use_qk_l2norm_in_kernel=bool(case.opt.get("use_qk_l2norm_in_kernel")), **gate)
    except ValueError as exc:  # its own input checks, before anything runs: a refusal with its reason
        raise NotImplementedError(f"fused_gdn refuses the case: {exc}") from None
    return {"o": o.reshape(B, T, HV, V), "ht": ht}


def describe(case) -> dict:
    lengths = case.lens or (case.T,) * case.B
    decode = 0 if not case.h0 else next((i for i, n in enumerate(lengths) if n != 1), len(lengths))
    return {"entry": f"{KERNEL}.fused_gdn", "requests": len(lengths), "decode_requests": decode}


class TpuInference:
    """The implementation object (:mod:`harness.legs.external`)."""

    distribution = "tpu-inference"  # the rows' version: tpu-inference's, not this project's (which ships the binding)
    tests_rule = {"summary": "allclose(atol = rtol = 1e-2)", "relative_to": "reference",
                  "default": {"atol": 1e-2, "rtol": 1e-2},
                  "source": "tpu-inference's kernel tests: allclose(atol=1e-2, rtol=1e-2)"}

    bindings = {"kda": LegBinding(forward, supports_kda, describe=describe, differentiable=False),
                "gdn": LegBinding(forward, _refusal, describe=describe, differentiable=False)}


IMPLEMENTATION = TpuInference()
