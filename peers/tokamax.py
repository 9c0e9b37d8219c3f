"""openxla/tokamax (``tokamax``, Google's Pallas kernel library) as three candidates:

- ``tokamax-kda``: the **Pallas Mosaic TPU KDA training op** of the PyPI release 0.0.17
  (``tokamax._src.ops.kda.pallas_mosaic_tpu.PallasMosaicTpuKimiDeltaAttention``), forward and backward through its
  own VJP op (``PallasMosaicTpuKimiDeltaAttentionVjp``, Pallas; the op is a ``jax.custom_vjp``, so the harness's
  ``jax.vjp`` of the forward runs tokamax's backward, not jax's derivative of its kernels). Called as
  ``tokamax._src.ops.kda.api.kimi_delta_attention(..., implementation="mosaic")`` calls it: the same keywords to
  the same op object with its defaults (``Config(chunk_size=64)``), the op's ``supported_on`` answered as below,
  and no fallback to its ``xla`` or ``xla_chunked`` implementations (:func:`kda_mosaic_call`).
- ``tokamax``: its fused causal-conv1d + gated delta rule **serving kernel** on gdn, forward only, Pallas Mosaic TPU
  (``tokamax._src.ops.causal_conv1d_gated_delta_rule``), gated at openxla/tokamax main @ 783ea95 (2026-08-21,
  version string 0.0.13) and running at whatever tokamax is installed (0.0.17 has it too, with v3's read slots
  and spec decode added as optional arguments, which this binding does not pass). Called as its users call it:
  the op object ``PallasMosaicTpuCausalConv1dGatedDeltaRule()`` with its defaults (``decode_tile_size=4``,
  ``mixed_tile_size=64``, ``compute_precision=float32``, ``zero_initialize_out=True``; the op drops ``config``).
- ``tokamax-kda-xla``: ``tokamax.kimi_delta_attention`` (``implementation="xla"``, its only one) of the
  **unmerged** commit 8fcb8ff (2026-07-02, "Add Kimi Delta Attention XLA reference", not on main; version string
  0.0.12): a dense ``lax.scan`` over the tokens, float32 accumulation, plain XLA (no Pallas). Forward and backward
  (the harness differentiates the forward with ``jax.vjp``; the op has no vjp of its own, so jax differentiates its
  scan). The releases' ``kimi_delta_attention`` is another contract (head-first); the binding refuses it.

**tokamax-kda's mapping.** Its contract is head-first: q, k, g ``[H, B, T, K]``, v ``[H, B, T, V]``, beta
``[H, B, T]`` (post-activation, in [0, 1]), the state ``[B, N, H, K, V]``. The binding moves the head axis to the
front and back (exact), hands a dense case's ``h0`` as ``[B, 1, H, K, V]`` and a packed case's as ``[1, N, H, K, V]``
with ``segment_ids`` ``[1, T]`` (sequence i of ``lens`` is segment i + 1, tokamax's 1-indexed ids) and
``max_num_segments = N``. fla's options map onto its keywords: ``use_qk_l2norm_in_kernel`` -> ``use_qk_l2norm``,
``use_gate_in_kernel`` -> ``use_gate_in_kernel`` with ``a_log = A_log`` [H], ``delta_time_bias = dt_bias`` [H*K]
and ``lower_bound`` (its gate law is fla's: ``lower_bound * sigmoid(exp(A_log) (g + dt_bias))``, or
``-exp(A_log) softplus(g + dt_bias)`` without a bound, ``reference.py``); ``use_beta_sigmoid_in_kernel``: its beta is
post-activation, so the binding applies the sigmoid in float32 before the call, as the layer using it does (and as
this project's own TPU functions apply fla's in-kernel options before their kernels); ``safe_gate`` is a numerics
switch of fla's chunk kernels, and tokamax picks its own (``Config.safe_gate=None``: on for a pre-activated gate, and
with a bound). Refused by the binding, with the reason: fla's decode variant (``fused_recurrent``: this is a chunked
training op), grouped value heads (k and v take q's heads), ``allow_neg_eigval`` (beta must lie in [0, 1]), the
convolution in front. Refused by tokamax's own checks, in its words (``check_inputs_support``,
``_check_gate_support``, its ``bind``): fp16 ("bfloat16 and float32 inputs only"), a dense T not a multiple of 64, K
above 256, ``use_gate_in_kernel`` without ``lower_bound``. A version without the op, or whose op's ``bind`` lacks a
keyword this binding passes, is refused with its version and what it lacks (:func:`_import_kda_op`).

The serving kernel's signature is tpu-inference v3's (``fused_conv1d_gdn``: packed qkv ``[T, 2·H·K + HV·V]``, ``b``
beta's logits, ``a`` the raw gate, conv and recurrent state pools by slot, ``query_start_loc``, ``state_indices``,
``distribution = (decode_end, prefill_end, mixed_end)``, ``seq_lens``), from before v3 gained speculative decoding
and prefix caching: it has no ``read_state_indices``, ``read_offsets`` nor ``num_spec_tokens``. So the case maps as
:func:`peers.tpu_inference.conv1d_gdn` maps v3, except (:func:`conv1d_gdn`):

- each request reads and writes one slot (``state_indices``: request i -> slot 1 + i; slot 0 is its null slot), which
  holds ``h0[i]`` and ``conv_h0[i]`` (zeros without h0);
- its batched (decode) segment takes one token per request ("Only supports use case where query_lens[i] = 1",
  ``metadata.py``): with h0 the leading one-token requests form it; every other request (a verify window of 2 or 3
  tokens too: it has no spec decode) goes through its per-sequence segment;
- qkv, b and a go in at the case's dtype (its wrapper widens them to float32 itself, "TODO: Support bf16", and
  writes o in that dtype); the states, the conv weight and bias, A_log and dt_bias in float32, as its own tests pass
  them.

**Interpret mode.** Each op (the serving kernel and the KDA op alike) refuses to run unless ``supported_on(device)``: ``device.platform == "tpu" and
pltpu.get_tpu_info().generation >= 6`` (``pallas_mosaic_tpu.py``); ``Op.__call__`` raises "Not supported on
<device_kind>" otherwise (``ops/op.py``). The candidate leg forces interpret mode on every ``pallas_call`` and
answers ``get_tpu_info()`` with the emulated chip (v6e) or the compile target's, but the device the op inspects is
the CPU the arrays live on. So the binding calls a subclass whose ``supported_on`` keeps tokamax's generation test
and drops only the platform test where the device is not a TPU (:class:`_Op` below): on a TPU it is tokamax's own
check unchanged, off a TPU it asks whether the *emulated or compiled-for chip* is generation 6 or later. v6e and v7x
pass; a v5e compile is refused in tokamax's terms (generation 5 < 6). Nothing falls back to its XLA reference
(``base.CausalConv1dGatedDeltaRule``), which this binding never calls.

Refused, with the reason. ``tokamax``: what its maths fixes (it always convolves q, k, v with SiLU, normalises q
and k, computes the gate from ``A_log`` and ``dt_bias`` and squashes beta: a case maps only with ``conv1d=W`` and
all three in-kernel options; no ``allow_neg_eigval``; q scaled by K**-0.5 itself); kda (no kda kernel at this
commit); a verify window would need spec decode it lacks (it is run as a prefill instead, see above).
``tokamax-kda-xla``: packed sequences (no ``cu_seqlens``: one state per batch row), grouped value heads (``k``,
``g`` must have q's shape, ``v`` q's heads), ``state_v_first`` (its state is ``[B,H,K,V]``), and fla's in-kernel
options (q/k L2 norm, the ``A_log``/``dt_bias`` gate with ``lower_bound``, beta's sigmoid, ``allow_neg_eigval``,
``safe_gate``): it takes the activated ``g`` (log decay per key channel) and ``beta`` only. Either: a missing
install, or the other commit installed.

Install. tokamax's releases from 0.0.13 on need Python >= 3.12, and under Python 3.11 pip does not list them
(``pip index versions tokamax`` shows 0.0.1 to 0.0.12 and "Ignored the following versions that require a different
python version"). On Python 3.12, 0.0.17 (the KDA op and the serving kernel) is one command, ``-c`` keeping jax at
this project's pins:

    pip install -c .ci/constraints-py312.txt -e '.[tpu,test]' tokamax==0.0.17

The commits gated earlier, from a checkout (one tokamax per environment):

    git --git-dir=<openxla/tokamax clone>/.git archive 783ea95 | tar x -C /tmp/tokamax-783ea95
    pip install -e '.[tpu,test]' /tmp/tokamax-783ea95            # tokamax 0.0.13 (main): the serving kernel
    # in a second environment (one tokamax per environment):
    git --git-dir=... archive 8fcb8ff | tar x -C /tmp/tokamax-8fcb8ff
    pip install -e '.[tpu,test]' /tmp/tokamax-8fcb8ff            # tokamax 0.0.12 + the unmerged KDA reference

The rows' version names the distribution's version and where it was installed from (pip's ``direct_url.json``),
so a row says which commit ran.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util

from harness.ops import delta_rule
from harness.ops.base import LegBinding

from . import mapping, tpu_inference

MAIN = "783ea95"
KDA_COMMIT = "8fcb8ff"
INSTALL = ("git --git-dir=<openxla/tokamax clone> archive <commit> | tar x -C /tmp/tokamax-<commit> && "
           "pip install /tmp/tokamax-<commit> (Python >= 3.12, jax >= 0.11; the commit gated here, from a checkout)")
SERVING_INSTALL = ("pip install tokamax==0.0.17 (Python >= 3.12; pip under Python 3.11 does not list it), or "
                   + INSTALL)
"""How to install the serving kernel: the release, or the commit gated first."""
SERVING_ENTRY = ("tokamax._src.ops.causal_conv1d_gated_delta_rule.pallas_mosaic_tpu."
                 "PallasMosaicTpuCausalConv1dGatedDeltaRule")
KDA_ENTRY = "tokamax._src.ops.kda.api.kimi_delta_attention"
MIN_GENERATION = 6
"""tokamax's ``supported_on``: TPU generation 6 (v6e) or later."""


def _version() -> str:
    """tokamax's version and where it was installed from (a local directory names the commit it was archived at)."""
    try:
        if importlib.util.find_spec("tokamax") is None:
            return "tokamax (not installed)"
        dist = importlib.metadata.distribution("tokamax")
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return "tokamax (not installed)"
    source = ""
    try:
        import json

        url = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
        source = f" from {url}" if url else ""
    except (ValueError, OSError):
        pass
    return f"tokamax {dist.version}{source}"


def _import(module: str, name: str, commit: str):
    """(object, None) or (None, why): a missing install, or a tokamax without this op (the other commit)."""
    if importlib.util.find_spec("tokamax") is None:
        return None, f"tokamax is not installed ({INSTALL.replace('<commit>', commit)})"
    try:
        return getattr(importlib.import_module(module), name), None
    except ModuleNotFoundError as exc:
        return None, (f"the installed {_version()} has no {module} ({exc}); it is at openxla/tokamax@{commit} "
                      f"({INSTALL.replace('<commit>', commit)})")
    except Exception as exc:  # noqa: BLE001 - any import failure is the reason for every row
        return None, f"tokamax could not be imported: {type(exc).__name__}: {exc}"


# ------------------------------------------------------------------------------------------ the serving kernel
def _make_op():
    """tokamax's Pallas op, with ``supported_on`` asking about the emulated chip where the device is not a TPU."""
    module, _, name = SERVING_ENTRY.rpartition(".")
    return _generation_checked(getattr(importlib.import_module(module), name))()


def _generation_checked(base):
    """``base`` (a tokamax op class) unchanged but for ``supported_on`` off a TPU (module doc: interpret mode)."""

    @dataclasses.dataclass(frozen=True)
    class _Op(base):
        def supported_on(self, device) -> bool:
            if device.platform == "tpu":
                return super().supported_on(device)  # tokamax's own check, as it is
            return emulated_generation() >= MIN_GENERATION

    return _Op


def emulated_generation() -> int:
    """The TPU generation ``pltpu.get_tpu_info()`` answers with (the candidate leg answers with the interpreted
    chip, v6e, or the compile target's); 0 where it cannot answer (no TPU and no leg around)."""
    try:
        from jax.experimental.pallas import tpu as pltpu

        return int(pltpu.get_tpu_info().generation)
    except Exception:  # noqa: BLE001 - tokamax's own check answers False on any failure
        return 0


def _import_op():
    if importlib.util.find_spec("tokamax") is None:
        return None, f"tokamax is not installed ({SERVING_INSTALL.replace('<commit>', MAIN)})"
    try:
        return _make_op(), None
    except ModuleNotFoundError as exc:
        return None, (f"the installed {_version()} has no causal_conv1d_gated_delta_rule ({exc}); it is on "
                      f"openxla/tokamax main (@{MAIN}) and in 0.0.17 ({SERVING_INSTALL.replace('<commit>', MAIN)})")
    except Exception as exc:  # noqa: BLE001
        return None, f"tokamax could not be imported: {type(exc).__name__}: {exc}"


OP, OP_ERROR = _import_op()


def supports(case) -> str | None:
    return OP_ERROR or serving_refusal(case)


def serving_refusal(case) -> str | None:
    """Why the serving kernel cannot take the case (tokamax installed or not), or None."""
    if case.op != "gdn":
        return (f"tokamax's causal_conv1d_gated_delta_rule is the gated delta rule with a scalar decay per head "
                f"(gdn); {case.op} does not map (no kda kernel at {MAIN}; 0.0.17's op still takes gdn only: its KDA "
                f"mode is an argument of the internal wrapper.fused_conv1d_gdn, attention_mode, which the op "
                f"does not pass)")
    off = [f"{name}=0" for name in tpu_inference.SERVING_OPTIONS if not case.opt.get(name)]
    if off:
        return ("tokamax's causal_conv1d_gated_delta_rule always normalises q, k, computes the gate from A_log and "
                f"dt_bias and squashes beta in the kernel; this case has {', '.join(off)}")
    if not delta_rule.conv_width(case):
        return ("tokamax's causal_conv1d_gated_delta_rule always convolves q, k, v first (SiLU after): a case maps "
                "with conv1d=W")
    if case.opt.get("allow_neg_eigval"):
        return "tokamax's causal_conv1d_gated_delta_rule has no allow_neg_eigval"
    if case.scale is not None:
        return f"tokamax's causal_conv1d_gated_delta_rule scales q by K**-0.5 itself; this case sets scale={case.scale}"
    return None


def segments(case, lengths) -> int:
    """``decode_end``: with carried states (h0), the leading one-token requests form the batched segment (its
    metadata supports only one token per request there); 0 without h0 (every request a prefill)."""
    if not case.h0:
        return 0
    return next((i for i, n in enumerate(lengths) if n != 1), len(lengths))


def slot_arguments(case) -> dict:
    """The request and slot arguments of one call, as plain lists (tested without tokamax):
    ``query_start_loc``, ``state_indices`` (request i -> slot 1 + i), ``distribution`` (decode_end, N, N),
    ``seq_lens`` (one earlier token for a request with a carried state: the kernel reads a state only when
    ``seq_lens - query_lens > 0``), ``slots`` (pool size, slot 0 null)."""
    offsets, lengths = mapping.requests(case)
    n = len(lengths)
    return {"query_start_loc": list(offsets), "state_indices": [1 + i for i in range(n)],
            "distribution": [segments(case, lengths), n, n],
            "seq_lens": [length + int(case.h0) for length in lengths], "slots": n + 1}


def conv1d_gdn(case, a, op) -> dict:
    """One call of tokamax's op on the case's requests (module doc); o, ht (each request's slot) and conv_ht."""
    import jax.numpy as jnp

    B, T, H, K = a["q"].shape
    HV, V = a["v"].shape[2:]
    W = delta_rule.conv_width(case)
    s = slot_arguments(case)
    N = len(s["state_indices"])
    dtype = a["q"].dtype
    tokens, rows = tpu_inference.token_rows(case, dtype)
    qkv = tokens(delta_rule.pack_qkv(case, a, jnp.concatenate))
    D = qkv.shape[1]
    conv_h0 = (jnp.asarray(a["conv_h0"], jnp.float32).swapaxes(1, 2) if case.h0
               else jnp.zeros((N, W - 1, D), jnp.float32))
    # the recurrent cache in h0's dtype: float32, or a state_dtype case's bf16/fp16 (its kernel keeps that dtype)
    rec_h0 = jnp.asarray(a["h0"]) if case.h0 else jnp.zeros((N, HV, K, V), jnp.float32)
    slots = jnp.asarray(s["state_indices"])
    conv = jnp.zeros((s["slots"], W - 1, D), jnp.float32).at[slots].set(conv_h0)
    rec = jnp.zeros((s["slots"], HV, K, V), rec_h0.dtype).at[slots].set(rec_h0)
    bias = a.get("conv_bias")
    i32 = lambda x: jnp.asarray(x, jnp.int32)  # noqa: E731
    try:
        (conv_out, rec_out), out = op(
            qkv=qkv, b=tokens(a["beta"]), a=tokens(a["g"]), conv_state=conv, recurrent_state=rec,
            conv_weight=jnp.asarray(a["conv_weight"], jnp.float32)[:, None, :],
            conv_bias=None if bias is None else jnp.asarray(bias, jnp.float32),
            a_log=jnp.asarray(a["A_log"], jnp.float32), dt_bias=jnp.asarray(a["dt_bias"], jnp.float32),
            query_start_loc=i32(s["query_start_loc"]), state_indices=i32(s["state_indices"]),
            distribution=i32(s["distribution"]), seq_lens=i32(s["seq_lens"]),
            n_kq=H, n_v=HV, d_k=K, d_v=V, kernel_size=W)
    except NotImplementedError as exc:  # its supported_on (a v5e compile target), in its words and the chip's
        raise NotImplementedError(f"tokamax refuses the case: {exc} (supported_on: TPU generation >= "
                                  f"{MIN_GENERATION}; this chip's is {emulated_generation()})") from None
    except (AssertionError, ValueError, TypeError) as exc:  # its input checks, or its trace failing on the shapes
        raise NotImplementedError(f"tokamax's causal_conv1d_gated_delta_rule does not take the case (raised before "
                                  f"running): {type(exc).__name__}: {exc}") from None
    o = out[:B * T].reshape(B, T, HV, V).astype(dtype)
    return {"o": o, "ht": rec_out[slots], "conv_ht": conv_out[slots].swapaxes(1, 2).astype(dtype)}


def forward(case, a, ctx):
    del ctx  # the candidate leg forces interpret mode itself (module doc)
    return conv1d_gdn(case, a, OP)


def describe(case) -> dict:
    s = slot_arguments(case)
    return {"entry": f"{SERVING_ENTRY}() ({_version()}), its defaults",
            "requests": len(s["state_indices"]), "batched_requests": s["distribution"][0],
            "state_slots": "one slot per request, read and written (state_indices); no read slots apart",
            "compute_precision": "float32 (its default)", "decode_tile_size": 4, "mixed_tile_size": 64,
            "supported_on": f"tokamax's TPU generation >= {MIN_GENERATION} test, asked of the emulated or compiled "
                            "chip off a TPU (peers/tokamax.py)",
            "ran_as": "Pallas (tokamax's fused conv1d + GDN, Mosaic TPU)"}


class Tokamax:
    """The implementation object (:mod:`harness.legs.external`): the serving kernel."""

    def __init__(self, bindings: dict):
        self.bindings = bindings

    @property
    def version(self) -> str:
        return _version()


IMPLEMENTATION = Tokamax({"gdn": LegBinding(forward, supports, describe=describe, differentiable=False)})


# ------------------------------------------------------------------------------------------ the KDA reference
def _import_kda_reference():
    """8fcb8ff's ``kimi_delta_attention`` ([B,T,H,K] in), or why not: the PyPI releases from 0.0.13 on have a
    function of that name with another contract (head-first [H,B,T,D], a state [B,N,H,K,V], varlen
    ``segment_ids``), which this binding's call would silently misread."""
    fn, why = _import("tokamax._src.ops.kda.api", "kimi_delta_attention", KDA_COMMIT)
    if fn is None:
        return None, why
    import inspect

    if "segment_ids" in inspect.signature(fn).parameters:
        return None, (f"the installed {_version()}'s kimi_delta_attention is the head-first [H,B,T,D] API of the "
                      f"releases, not the [B,T,H,K] reference of openxla/tokamax@{KDA_COMMIT} this binding calls "
                      f"(its Pallas op is the candidate tokamax-kda)")
    return fn, None


_KDA, _KDA_ERROR = _import_kda_reference()

KDA_REFUSED = {
    "use_qk_l2norm_in_kernel": "no q/k L2 norm (it takes q and k as they are)",
    "use_gate_in_kernel": "no in-kernel gate (g is the log decay per key channel, already activated)",
    "lower_bound": "no lower_bound (no in-kernel gate)",
    "use_beta_sigmoid_in_kernel": "no sigmoid on beta (beta is the learning rate itself)",
    "allow_neg_eigval": "no allow_neg_eigval",
    "safe_gate": "no safe_gate",
}


def supports_kda(case) -> str | None:
    return _KDA_ERROR or kda_refusal(case)


def kda_refusal(case) -> str | None:
    """Why the KDA reference cannot take the case (tokamax installed or not), or None."""
    why = mapping.refused_options(case, f"tokamax.kimi_delta_attention (@{KDA_COMMIT})", KDA_REFUSED)
    if why:
        return why
    if case.cu_seqlens is not None:
        return (f"tokamax.kimi_delta_attention (@{KDA_COMMIT}) takes dense [B,T,H,K] inputs with one state per batch "
                "row: no packed sequences (cu_seqlens)")
    if case.HV != case.H:
        return (f"tokamax.kimi_delta_attention (@{KDA_COMMIT}) requires k and g of q's shape and v of q's heads: no "
                f"grouped value heads (HV={case.HV}, H={case.H})")
    if case.state_v_first:
        return f"tokamax.kimi_delta_attention (@{KDA_COMMIT}) lays its state out [B,H,K,V]: no state_v_first"
    if delta_rule.conv_width(case):
        return f"tokamax.kimi_delta_attention (@{KDA_COMMIT}) has no convolution in front (conv1d)"
    return None


def forward_kda(case, a, ctx):
    del ctx  # plain XLA: nothing to interpret
    try:
        o, ht = _KDA(a["q"], a["k"], a["v"], a["g"], a["beta"], scale=case.resolved_scale,
                     initial_state=a.get("h0"), output_final_state=case.final_state, implementation="xla")
    except ValueError as exc:  # its shape checks (bind), in its words
        if not mapping.raised_by(exc, importlib.util.find_spec("tokamax").origin):
            raise
        raise NotImplementedError(f"tokamax.kimi_delta_attention refuses the case: {exc}") from None
    return {"o": o, "ht": ht}


def describe_kda(case) -> dict:
    return {"entry": f"{KDA_ENTRY}(implementation='xla') (openxla/tokamax@{KDA_COMMIT}, unmerged)",
            "ran_as": "XLA (a dense lax.scan over tokens, float32 accumulation; backward: jax's vjp of the scan)"}


KDA_XLA = Tokamax({"kda": LegBinding(forward_kda, supports_kda, describe=describe_kda)})


# ------------------------------------------------------------------ KDA: 0.0.17's Pallas Mosaic TPU training op
KDA_RELEASE = "0.0.17"
KDA_MOSAIC_INSTALL = (f"pip install tokamax=={KDA_RELEASE} (Python >= 3.12: under Python 3.11 pip lists 0.0.1 to "
                      "0.0.12 only and hides 0.0.13 onwards, 'Ignored the following versions that require a "
                      "different python version')")
KDA_MOSAIC_ENTRY = "tokamax._src.ops.kda.pallas_mosaic_tpu.PallasMosaicTpuKimiDeltaAttention"
KDA_MOSAIC_CHUNK = 64
"""Its one chunk size (``check_inputs_support``: "`mosaic` currently supports chunk_size=64")."""
KDA_MOSAIC_ARGUMENTS = ("query", "key", "value", "gate", "beta", "a_log", "delta_time_bias", "scale", "initial_state",
                        "output_final_state", "use_qk_l2norm", "use_gate_in_kernel", "segment_ids", "lower_bound",
                        "max_num_segments")
"""The keywords this binding passes, as ``tokamax._src.ops.kda.api.kimi_delta_attention`` passes them to the op
(0.0.17's signature): a version whose op lacks one is refused."""


def _signature_refusal(cls) -> str | None:
    """Why the installed op's ``bind`` does not take :data:`KDA_MOSAIC_ARGUMENTS`, or None."""
    import inspect

    params = inspect.signature(cls.bind).parameters
    missing = [name for name in KDA_MOSAIC_ARGUMENTS if name not in params]
    if missing:
        return (f"the installed {_version()}'s {cls.__name__}.bind differs in signature from {KDA_RELEASE}'s: it "
                f"has no {', '.join(missing)} ({KDA_MOSAIC_INSTALL})")
    return None


def _import_kda_op():
    """(op, None) or (None, why): not installed; a version without the Pallas KDA op, or whose op differs in
    signature from 0.0.17's; or an import failure."""
    if importlib.util.find_spec("tokamax") is None:
        return None, f"tokamax is not installed ({KDA_MOSAIC_INSTALL})"
    module, _, name = KDA_MOSAIC_ENTRY.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as exc:
        return None, f"the installed {_version()} has no Pallas KDA op ({module}: {exc}) ({KDA_MOSAIC_INSTALL})"
    except AttributeError:
        return None, f"the installed {_version()}'s {module} has no {name} ({KDA_MOSAIC_INSTALL})"
    except Exception as exc:  # noqa: BLE001 - any import failure is the reason for every row
        return None, f"tokamax could not be imported: {type(exc).__name__}: {exc}"
    why = _signature_refusal(cls)
    return (None, why) if why else (_generation_checked(cls)(), None)


KDA_OP, KDA_OP_ERROR = _import_kda_op()

KDA_MOSAIC_REFUSED = {
    "allow_neg_eigval": "no allow_neg_eigval (beta, post-activation, must lie in [0, 1]: base._validate_beta)",
    "conv1d": "no convolution in front (conv1d)",
}


def supports_kda_mosaic(case) -> str | None:
    return KDA_OP_ERROR or kda_mosaic_refusal(case)


def kda_mosaic_refusal(case) -> str | None:
    """Why 0.0.17's Pallas KDA op cannot take the case (tokamax installed or not), or None. What its own checks
    refuse (fp16, T not a multiple of 64 without segments, ``use_gate_in_kernel`` without ``lower_bound``) is
    refused by them, in its words, when the case runs."""
    entry = f"tokamax {KDA_RELEASE}'s Pallas KDA (mosaic)"
    if case.variant != "chunk":
        return (f"{entry} is a chunked training op (chunk_size {KDA_MOSAIC_CHUNK}, its own backward); fla's "
                f"{case.variant} decode kernels map onto its serving kernel, not onto it")
    why = mapping.refused_options(case, entry, KDA_MOSAIC_REFUSED)
    if why:
        return why
    if case.HV != case.H:
        return (f"{entry} takes key and value of q's heads ([H, B, T, D] each): no grouped value heads "
                f"(HV={case.HV}, H={case.H})")
    return None


def segment_ids(case):
    """The 1-indexed segment of every token ([1, T] int32; tokamax's varlen input, padding 0) of a packed case,
    None otherwise: sequence i of ``lens`` is segment i + 1 (an empty sequence has no token, its segment none)."""
    import numpy as np

    if case.lens is None:
        return None
    return np.repeat(np.arange(1, len(case.lens) + 1, dtype=np.int32), case.lens)[None]


def kda_mosaic_call(case, a, op) -> dict:
    """One call of the op with the case's tensors in its head-first layout (module doc), o and ht back in fla's."""
    import jax
    import jax.numpy as jnp

    from harness.ops import kda

    opts = kda.options(case)
    head_first = lambda x: jnp.moveaxis(x, 2, 0)  # noqa: E731 - [B,T,H,...] -> [H,B,T,...]
    beta = a["beta"]
    if opts["use_beta_sigmoid_in_kernel"]:  # its beta is post-activation: the layer squashes it before the call
        beta = jax.nn.sigmoid(beta.astype(jnp.float32))
    h0 = a.get("h0")  # K-first whatever the case's layout: the leg swaps a V-first state on both sides
    packed = case.lens is not None
    if h0 is not None:  # [N,H,K,V] -> [B, N, H, K, V]: one state per batch row, or per segment of the one row
        h0 = h0[None] if packed else h0[:, None]
    segments = segment_ids(case)
    try:
        o, ht = op(query=head_first(a["q"]), key=head_first(a["k"]), value=head_first(a["v"]),
                   gate=head_first(a["g"]), beta=head_first(beta), a_log=a.get("A_log"),
                   delta_time_bias=a.get("dt_bias"), scale=case.resolved_scale, initial_state=h0,
                   output_final_state=case.final_state, use_qk_l2norm=opts["use_qk_l2norm_in_kernel"],
                   use_gate_in_kernel=opts["use_gate_in_kernel"],
                   segment_ids=None if segments is None else jnp.asarray(segments),
                   lower_bound=opts["lower_bound"], max_num_segments=case.num_seqs if packed else None)
    except NotImplementedError as exc:  # its check_inputs_support, _check_gate_support and supported_on
        chip = (f" (supported_on: TPU generation >= {MIN_GENERATION}; this chip's is {emulated_generation()})"
                if str(exc).startswith("Not supported on") else "")
        raise NotImplementedError(f"tokamax's Pallas KDA refuses the case: {exc}{chip}") from None
    except ValueError as exc:  # its bind's checks, in its words
        if not mapping.raised_by(exc, importlib.util.find_spec("tokamax").origin):
            raise
        raise NotImplementedError(f"tokamax's Pallas KDA refuses the case: {exc}") from None
    o = jnp.moveaxis(o, 0, 2)
    if ht is not None:
        ht = ht[0] if packed else ht[:, 0]
    return {"o": o, "ht": ht}


def forward_kda_mosaic(case, a, ctx):
    del ctx  # the candidate leg forces interpret mode itself (module doc)
    return kda_mosaic_call(case, a, KDA_OP)


def describe_kda_mosaic(case) -> dict:
    from harness.ops import kda

    opts = kda.options(case)
    out = {"entry": f"{KDA_MOSAIC_ENTRY}() ({_version()}), its defaults: Config(chunk_size=64, "
                    "safe_gate=None, rematerialize_for_backward=False)",
           "chunk_size": f"{KDA_MOSAIC_CHUNK} (its only one; the case's C is fla's)",
           "layout": "head-first [H,B,T,D] in, o moved back; state [B,N,H,K,V]",
           "supported_on": f"tokamax's TPU generation >= {MIN_GENERATION} test, asked of the emulated or compiled "
                           "chip off a TPU (peers/tokamax.py)",
           "ran_as": "Pallas (tokamax's Mosaic TPU KDA forward; backward: its own VJP op, "
                     "PallasMosaicTpuKimiDeltaAttentionVjp, Pallas)"}
    if opts["use_beta_sigmoid_in_kernel"]:
        out["beta"] = "sigmoid applied by the binding in float32 before the call (its beta is post-activation)"
    if case.lens is not None:
        out["packed"] = f"segment_ids [1, T] (1-indexed), max_num_segments={case.num_seqs}"
    return out


KDA_MOSAIC = Tokamax({"kda": LegBinding(forward_kda_mosaic, supports_kda_mosaic, describe=describe_kda_mosaic)})
