"""vLLM's TPU backend (``tpu-inference`` on PyPI) as candidates, one per kernel generation of its gated delta rule:
``tpu-inference`` (v1, ``fused_gdn``, below), ``tpu-inference-v2`` (its decode kernel, :data:`V2`) and
``tpu-inference-v3`` (the fused conv1d + GDN kernel vLLM runs by default, :data:`V3`).

``tpu_inference.kernels.gdn.v1.fused_gdn_kernel_wrapper.fused_gdn`` is a forward kernel for the gated delta
rule family, serving packed requests from a state cache: gdn's scalar decay per head ([T, H_v], which it
broadcasts over K) and kda's per-channel gate ([T, H_v, K]). This binding maps a gdn or a kda case onto it:

- the batch rows (or the case's packed sequences) become requests: tokens ``[T_total, H, K]`` with
  ``cu_seqlens``. With ``h0``, the leading one-token sequences are decode requests (its decode kernel: one
  token on a carried state) and the rest prefill (``distribution = (decode_end, N)``); without, all prefill;
- grouped value heads map as they are: q and k keep their ``H`` heads, v, the gate, beta and the state have
  ``HV`` (its ``H_qk`` and ``H_v``; it repeats q and k to the value heads itself);
- ``h0`` is the state cache ``[N, HV, K, V]`` (``state_indices = 0..N-1``; ``has_initial_state`` False
  without h0, which zeroes each slot in the kernel), in h0's dtype: a case's ``state_dtype=bf16`` hands it the
  bf16 cache vLLM keeps with ``TPU_MAMBA_SSM_CACHE_DTYPE=bfloat16`` (0.20.0's kernel refuses one, 0.21.0's takes
  it and keeps it, from 0.22.0 the wrapper widens it to float32: #2482, #2671); the cache it returns is ``ht``
  (the serving wrapper writes it back in the cache's dtype when the kernel returns another);
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

from harness.ops import delta_rule
from harness.ops.base import LegBinding

from . import mapping

KERNEL = "tpu_inference.kernels.gdn.v1.fused_gdn_kernel_wrapper"
FLAT_KERNEL = "tpu_inference.kernels.gdn.fused_gdn_kernel_wrapper"
"""Where ``fused_gdn`` lived before the kernels moved under ``v1/`` (releases 0.20.0 and 0.21.0, and the nightlies
before it): the same signature, so the binding takes whichever module the installed release has."""
V2_KERNEL = "tpu_inference.kernels.gdn.v2.gdn_decode_kernel"
V3_KERNEL = "tpu_inference.kernels.gdn.v3.wrapper"
INSTALL = "pip install --no-deps tpu-inference"


def _module(name: str):
    """A kernel module of tpu-inference, imported without running ``tpu_inference/__init__.py`` (which imports
    vLLM)."""
    if "tpu_inference" not in sys.modules:
        spec = importlib.util.find_spec("tpu_inference")
        if spec is None:
            raise NotImplementedError(f"tpu-inference is not installed ({INSTALL})")
        sys.modules["tpu_inference"] = importlib.util.module_from_spec(spec)  # its __init__ is never executed
    return importlib.import_module(name)


def _kernel():
    """``fused_gdn`` of the installed release: under ``v1/`` from 0.22.0, flat before (:data:`FLAT_KERNEL`)."""
    _module("tpu_inference")
    moved = importlib.util.find_spec("tpu_inference.kernels.gdn.v1") is not None
    return _module(KERNEL if moved else FLAT_KERNEL).fused_gdn


_NO_GDN = ("no GDN kernel in this release: fused_gdn came with PR #2157 (merged 2026-04-22, first in the nightly "
           "0.18.0.dev20260423 and the release 0.20.0; 0.19.0 was branched from main on 2026-04-19)")
VERSION_REFUSALS = (
    ("<0.18.0.dev20260423", _NO_GDN), ("==0.18.0rc1", _NO_GDN), ("==0.18.0", _NO_GDN), ("==0.19.0", _NO_GDN),
    (">=0.18.0.dev20260423,<0.18.0.dev20260429",
     "fused_gdn takes no has_initial_state before PR #2431 (merged 2026-04-28), and the binding passes it"),
)
"""The releases ``parity bisect`` refuses for v1's binding, with the reason (:mod:`harness.bisect.versions`): read
from each release's wheel (docs/bisect.md)."""


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
    if opt.get("conv1d"):
        return "v1's fused_gdn has no convolution in front (v3's fused_conv1d_gdn has)"
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
    offsets, lengths = mapping.requests(case)
    N = len(lengths)

    def tokens(x):
        return x.reshape((B * T,) + x.shape[2:])

    h0 = a.get("h0")
    decode_end = 0 if h0 is None else next((i for i, n in enumerate(lengths) if n != 1), N)
    # a copy (the kernel donates it), in the cache's dtype: float32, or a state_dtype case's bf16 or fp16
    cache = jnp.zeros((N, HV, K, V), jnp.float32) if h0 is None else jnp.array(h0)
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
    _, lengths = mapping.requests(case)
    decode = 0 if not case.h0 else next((i for i, n in enumerate(lengths) if n != 1), len(lengths))
    return {"entry": f"{KERNEL}.fused_gdn", "requests": len(lengths), "decode_requests": decode}


class TpuInference:
    """The implementation object (:mod:`harness.legs.external`)."""

    distribution = "tpu-inference"  # the rows' version: tpu-inference's, not this project's (which ships the binding)
    tests_rule = {"summary": "allclose(atol = rtol = 1e-2)", "relative_to": "reference",
                  "default": {"atol": 1e-2, "rtol": 1e-2},
                  "source": "tpu-inference's kernel tests: allclose(atol=1e-2, rtol=1e-2)"}

    version_refusals = VERSION_REFUSALS  # parity bisect: releases this binding cannot map, and why

    bindings = {"kda": LegBinding(forward, supports_kda, describe=describe, differentiable=False),
                "gdn": LegBinding(forward, _refusal, describe=describe, differentiable=False)}


IMPLEMENTATION = TpuInference()


# ------------------------------------------------------------------------------------------ v3 and v2
SERVING_OPTIONS = ("use_qk_l2norm_in_kernel", "use_gate_in_kernel", "use_beta_sigmoid_in_kernel")
"""What the v2 and v3 kernels always do in the kernel, as vLLM's Qwen3-Next layer calls them: normalise q and k,
compute the gate from ``A_log`` and ``dt_bias``, squash beta's logits. A case maps only with all three."""

SPEC_TOKENS = 2
"""v3's ``num_spec_tokens`` for a case whose leading requests (from carried states) hold 2 or 3 tokens: verify
windows of up to ``SPEC_TOKENS + 1`` tokens, each written as one state checkpoint per token."""

TOKEN_ALIGN = 16
"""v3 traces only for a token count that is a multiple of 16 (an odd chunk does not broadcast): the binding pads
the packed tokens with rows that belong to no request."""


def token_rows(case, dtype, align: int = TOKEN_ALIGN):
    """How the v3-family kernels take a per-token array: ``(tokens, rows)``, ``tokens(x)`` the array [B,T,...] as
    [B·T, ...] in ``dtype``, padded with zero rows to ``rows``, the next multiple of ``align``."""
    import jax.numpy as jnp

    n = case.B * case.T
    rows = -(-n // align) * align

    def tokens(x):
        x = jnp.asarray(x).reshape((n,) + x.shape[2:]).astype(dtype)
        return jnp.pad(x, [(0, rows - n)] + [(0, 0)] * (x.ndim - 1))

    return tokens, rows


def serving_refusal(case, generation: str) -> str | None:
    """What neither v2 nor v3 can take: a missing install, kda, an option off, a second gate form, another scale."""
    if importlib.util.find_spec("tpu_inference") is None:
        return f"tpu-inference is not installed ({INSTALL})"
    if case.op != "gdn":
        return f"{generation} is the gated delta rule with a scalar decay per head (gdn); {case.op} does not map"
    off = [name for name in SERVING_OPTIONS if not case.opt.get(name)]
    if off:
        return (f"{generation} always normalises q, k, computes the gate and squashes beta in the kernel; this case "
                f"has {', '.join(o + '=0' for o in off)}")
    if case.opt.get("allow_neg_eigval"):
        return f"{generation} has no allow_neg_eigval"
    if case.scale is not None:
        return f"{generation} scales q by K**-0.5 itself; this case sets scale={case.scale}"
    return None


def _windows(case, lengths) -> tuple[int, int]:
    """(decode_end, num_spec_tokens): with carried states, the leading requests of at most ``SPEC_TOKENS + 1``
    tokens form v3's batched segment (one-token decodes, or verify windows when one holds more than a token)."""
    if not case.h0:
        return 0, 0
    end = next((i for i, n in enumerate(lengths) if n > SPEC_TOKENS + 1), len(lengths))
    return end, SPEC_TOKENS if any(n > 1 for n in lengths[:end]) else 0


def supports_v3(case) -> str | None:
    why = serving_refusal(case, "v3's fused_conv1d_gdn")
    if why:
        return why
    if not delta_rule.conv_width(case):
        return "v3's fused_conv1d_gdn always convolves q, k, v first (SiLU after): a case maps with conv1d=W"
    return None


def forward_v3(case, a, ctx):
    """One ``fused_conv1d_gdn`` call on the case's requests (:func:`conv1d_gdn`), read slots apart."""
    del ctx  # the candidate leg forces interpret mode itself
    return conv1d_gdn(case, a, _module(V3_KERNEL).fused_conv1d_gdn, read_slots_apart=True, batched=True)


def conv1d_gdn(case, a, fused_conv1d_gdn, *, read_slots_apart: bool, batched: bool) -> dict:
    """One call of v3's ``fused_conv1d_gdn`` (or a vendored copy of it: sglang-jax's ``fused_chunk_parallel``,
    which has no ``read_state_indices``) on the case's requests.

    - qkv: q, k, v packed per token as the case's convolution reads them ([T, 2·H·K + HV·V], the layout v3
      takes); ``b`` beta's logits, ``a`` the raw gate; the conv weight [D, 1, W] (fla's Conv1d weight).
    - Segments: with ``batched``, the leading short requests from carried states form v3's batched segment
      (decodes, or verify windows: :func:`_windows`) and the rest its per-sequence one; without, every request
      is in the per-sequence segment (``distribution = (0, N, N)``), as sglang-jax's prefill calls it.
    - State slots: slot 0 is v3's null slot; request i writes slots from ``1 + i·w`` (w = 1, or
      ``SPEC_TOKENS + 1`` checkpoint slots per verify window). With ``read_slots_apart`` it reads a slot of its
      own after them (v3's ``read_state_indices``, vLLM's prefix caching), else its first write slot; the read
      slot holds ``h0[i]`` and ``conv_h0[i]`` (zeros without h0). A state read from the wrong slot shows in
      ``ht``; a read slot apart that comes back changed in any bit raises :class:`peers.mapping.SlotWritten`
      (an ``error`` row naming the slots).
    - ``seq_lens`` counts one earlier token for a request with a carried state (v3 reads a state only then).
    - ``ht`` and ``conv_ht``: each request's last checkpoint (of its last token).
    - The recurrent state cache is in h0's dtype (a ``state_dtype`` case's bf16 or fp16; float32 otherwise): v3
      keeps it so (``Dtypes.recurrent_state``) and writes each checkpoint back in it."""
    import jax.numpy as jnp

    B, T, H, K = a["q"].shape
    HV, V = a["v"].shape[2:]
    W = delta_rule.conv_width(case)
    offsets, lengths = mapping.requests(case)
    N = len(lengths)
    decode_end, spec = _windows(case, lengths) if batched else (0, 0)
    group = [SPEC_TOKENS + 1 if spec and i < decode_end else 1 for i in range(N)]
    write = [1 + sum(group[:i]) for i in range(N)]
    read = [1 + sum(group) + i for i in range(N)] if read_slots_apart else write
    slots = 1 + sum(group) + (N if read_slots_apart else 0)
    tokens, rows = token_rows(case, jnp.float32)
    qkv = tokens(delta_rule.pack_qkv(case, a, jnp.concatenate))
    D = qkv.shape[1]
    # what the read slots hold: the carried states, or zeros (a fresh request reads none, and they stay zero)
    conv_read = (jnp.asarray(a["conv_h0"], jnp.float32).swapaxes(1, 2) if case.h0
                 else jnp.zeros((N, W - 1, D), jnp.float32))
    rec_read = jnp.asarray(a["h0"]) if case.h0 else jnp.zeros((N, HV, K, V), jnp.float32)
    conv = jnp.zeros((slots, W - 1, D), jnp.float32).at[jnp.asarray(read)].set(conv_read)
    rec = jnp.zeros((slots, HV, K, V), rec_read.dtype).at[jnp.asarray(read)].set(rec_read)
    i32 = lambda x: jnp.asarray(x, jnp.int32)  # noqa: E731
    bias = a.get("conv_bias")
    slot_args = [i32(offsets), i32(write), i32((decode_end, N, N)), i32([n + int(case.h0) for n in lengths])]
    try:
        (conv_out, rec_out), out = fused_conv1d_gdn(
            qkv, tokens(a["beta"]), tokens(a["g"]), conv, rec,
            jnp.asarray(a["conv_weight"], jnp.float32)[:, None, :],
            None if bias is None else jnp.asarray(bias, jnp.float32),
            jnp.asarray(a["A_log"], jnp.float32), jnp.asarray(a["dt_bias"], jnp.float32),
            *slot_args, *([i32(read)] if read_slots_apart else []), read_offsets=i32([0] * N) if spec else None,
            n_kq=H, n_v=HV, d_k=K, d_v=V, kernel_size=W, num_spec_tokens=spec)
    except (AssertionError, ValueError, TypeError) as exc:  # its input checks, or its trace failing on the shapes
        raise NotImplementedError(f"fused_conv1d_gdn does not take the case (raised before running): "
                                  f"{type(exc).__name__}: {exc}") from None
    if read_slots_apart:  # prefix caching's blocks are read, never written: a stray write would corrupt a prefix
        mapping.check_kept(conv_read, conv_out[jnp.asarray(read)], read, "fused_conv1d_gdn's conv state")
        mapping.check_kept(rec_read, rec_out[jnp.asarray(read)], read, "fused_conv1d_gdn's recurrent state")
    last = jnp.asarray([w + (n - 1 if g > 1 else 0) for w, n, g in zip(write, lengths, group)])
    o = out[:B * T].reshape(B, T, HV, V).astype(a["q"].dtype)
    return {"o": o, "ht": rec_out[last], "conv_ht": conv_out[last].swapaxes(1, 2).astype(a["q"].dtype)}


def describe_v3(case) -> dict:
    _, lengths = mapping.requests(case)
    decode_end, spec = _windows(case, lengths)
    return {"entry": f"{V3_KERNEL}.fused_conv1d_gdn", "requests": len(lengths), "batched_requests": decode_end,
            "num_spec_tokens": spec, "compute_precision": "float32 (its default)",
            "state_slots": "read slots apart from write slots (read_state_indices)"}


def supports_v2(case) -> str | None:
    why = serving_refusal(case, "v2's ragged_gated_delta_rule_decode_only")
    if why:
        return why
    if delta_rule.conv_width(case):
        return ("v2's decode kernel takes q, k, v after the convolution (vLLM runs it apart); its apply_silu is the "
                "convolution's activation alone: a case maps without conv1d")
    _, lengths = mapping.requests(case)
    if not case.h0 or any(n != 1 for n in lengths):
        return ("v2's ragged_gated_delta_rule_decode_only is the decode path: one token per request, each from "
                "its carried state (h0); its chunked recurrent_scan is not bound (it applies SiLU to q, k, v "
                "in the kernel, which no case without the convolution has)")
    return None


def forward_v2(case, a, ctx):
    """``ragged_gated_delta_rule_decode_only``: request i's one token reads and writes state slot ``1 + i`` (slot
    0 null); the packed tokens are padded to a multiple of 8 rows of the null slot. The state cache is in h0's
    dtype (a ``state_dtype`` case's bf16 or fp16), as vLLM hands the kernel its cache."""
    import jax.numpy as jnp

    del ctx
    kernel = _module(V2_KERNEL).ragged_gated_delta_rule_decode_only
    B, T, H, K = a["q"].shape
    HV, V = a["v"].shape[2:]
    N = B * T
    tokens, rows = token_rows(case, jnp.float32, align=8)

    h0 = jnp.asarray(a["h0"])
    rec = jnp.zeros((N + 1, HV, K, V), h0.dtype).at[1:].set(h0)
    slots = jnp.asarray(list(range(1, N + 1)) + [0] * (rows - N), jnp.int32)
    try:
        rec_out, out = kernel(tokens(delta_rule.pack_qkv(case, a, jnp.concatenate)), tokens(a["beta"]),
                              tokens(a["g"]), rec, jnp.asarray(a["A_log"], jnp.float32),
                              jnp.asarray(a["dt_bias"], jnp.float32), jnp.arange(N + 1, dtype=jnp.int32), slots,
                              jnp.asarray((N, N, N), jnp.int32), n_kq=H, n_v=HV, d_k=K, d_v=V)
    except (AssertionError, ValueError, TypeError) as exc:
        raise NotImplementedError(f"ragged_gated_delta_rule_decode_only does not take the case (raised before "
                                  f"running): {type(exc).__name__}: {exc}") from None
    return {"o": out[:N].reshape(B, T, HV, V).astype(a["q"].dtype), "ht": rec_out[1:]}


class _Generation(TpuInference):
    """One more kernel generation of tpu-inference, its own candidate (rows and reports apart from v1's)."""

    def __init__(self, gdn: LegBinding, version_refusals: tuple = ()):
        self.bindings = {"gdn": gdn}
        self.version_refusals = version_refusals


V3 = _Generation(LegBinding(forward_v3, supports_v3, describe=describe_v3, differentiable=False), (
    ("<0.24.0", "no fused_conv1d_gdn (kernels/gdn/v3) before 0.24.0"),
    (">=0.24.0,<0.29.0", "fused_conv1d_gdn takes no read_state_indices before 0.29.0 (0.24.0 and 0.25.0 no "
                         "read_offsets nor num_spec_tokens either): the binding reads each request's state from a "
                         "slot apart from its write slots (vLLM's prefix caching), which these releases cannot "
                         "be called with")))
V2 = _Generation(LegBinding(forward_v2, supports_v2,
                            describe=lambda c: {"entry": f"{V2_KERNEL}.ragged_gated_delta_rule_decode_only"},
                            differentiable=False), (
    ("<0.22.0", "no ragged_gated_delta_rule_decode_only (kernels/gdn/v2) in a release before 0.22.0"),))
