"""sglang-jax (GitHub sgl-project/sglang-jax, import name ``sgl_jax``), SGLang's JAX/TPU serving backend, as
candidates: the linear-attention kernels it serves models with, under ``python/sgl_jax/srt/kernels/``.

``sglang-jax`` binds one entry point per harness op and variant:

- ``simple_gla.chunk``: ``simple_gla.simple_gla_fwd`` (tops' chunk forward, vendored from tops release/v0.4 rev
  41431b1 with a varlen patch; Ling-2.5/2.6 run it with ALiBi slopes as ``g_gamma``). Packed sequences only
  (``cu_seqlens_dev``): a batched case's rows become packed requests of equal length (exact: the state is
  per request). ``g_gamma`` [] or [H] as [H]; no per-token ``g``. Pallas.
- ``simple_gla.fused_recurrent``: ``simple_gla.fused_recurrent_simple_gla``, pure JAX (``lax.scan``): ``g``,
  ``g_gamma`` or both (it adds them per token, as fla does), dense or packed.
- ``kda.chunk``: ``kda.chunk_kda`` (tops' KDA chunk forward, vendored at rev 3c691ad3; Kimi-Linear runs it),
  packed only (B = 1 with ``cu_seqlens``; a batched case's rows become requests), beta as probabilities, q and k
  as given; its in-kernel gate (``A_log`` [H], ``dt_bias`` per channel, ``lower_bound``) maps exactly. Pallas.
- ``gdn``: with the convolution in front (``conv1d=W``), ``gdn.fused_chunk_parallel.fused_conv1d_gdn``, a
  vendored snapshot of tpu-inference's GDN v3 (commit a9072c8; Qwen3.5 runs it), mapped as the tpu-inference-v3
  binding maps v3 (:func:`peers.tpu_inference.conv1d_gdn`), as sglang-jax's prefill calls it: every request in
  the per-sequence segment (``distribution = (0, 0, N)``, no verify windows), its initial state read from its
  write slot (the snapshot has no ``read_state_indices``). Without it, the pure-JAX forms the convolution's output feeds:
  ``chunked_gated_delta_rule_jax`` for ``chunk`` cases (sglang-jax's ``chunked_jax`` prefill), and for
  ``fused_recurrent`` ones ``decode_gated_delta_rule_ref`` (its production decode) when every request is one
  token from a carried state, else ``ragged_gated_delta_rule_ref`` (token by token), on a state pool (slot 0
  null, request i in slot 1 + i, ``has_initial_state`` from h0). All of them normalise q and k, compute the gate
  from ``A_log`` and ``dt_bias`` and squash beta in the kernel, always: a gdn case maps only with all three.

``sglang-jax-decode`` binds ``simple_gla.simple_gla_fused.decode_simple_gla_fused``, sglang-jax's own Pallas
decode kernel, to ``simple_gla.fused_recurrent`` cases of one token per request: it reads and writes a pooled
state buffer by request (``recurrent_indices``, ``has_initial_state``). Request i uses slot 1 + i; slot 0 (its
dummy) and a spare slot after the last are named by no request, and the spare must come back bit for bit
(:func:`peers.mapping.check_kept`).

Pure-JAX forms run as XLA:TPU runs them as far as dots go: the candidate leg reads from the program compiled for
the chip which of their dots stay on the MXU (rounded as the MXU rounds them) and which XLA fuses into f32
multiply-reduces (computed in f32): :mod:`harness.compile.xla_dots`. Every binding is forward only (a serving stack:
none has a backward). Refused, with the reason: what an entry point does not take (listed in each
``supports_*``), and the kernels' own input checks (an ``AssertionError``, ``ValueError`` or
``NotImplementedError`` raised by sgl_jax's source).

Install, from the archive in ``../shared/peers/`` (no network; its package claims Python >= 3.12, but its kernel
modules import only jax and numpy and run on 3.11): ``tar xzf sglang-jax-cddbf6f.tar.gz`` then
``SETUPTOOLS_SCM_PRETEND_VERSION=0.0.2+cddbf6f pip install --no-deps --ignore-requires-python
sglang-jax-cddbf6f/python``.
"""

from __future__ import annotations

import importlib
import importlib.util

from harness.ops import delta_rule, gated
from harness.ops.base import LegBinding

from . import mapping, tpu_inference

INSTALL = ("tar xzf ../shared/peers/sglang-jax-cddbf6f.tar.gz && SETUPTOOLS_SCM_PRETEND_VERSION=0.0.2+cddbf6f "
           "pip install --no-deps --ignore-requires-python sglang-jax-cddbf6f/python")
KERNELS = "sgl_jax.srt.kernels"
ENTRY = {
    ("simple_gla", "chunk"): "simple_gla.simple_gla.simple_gla_fwd",
    ("simple_gla", "fused_recurrent"): "simple_gla.simple_gla.fused_recurrent_simple_gla",
    ("kda", "chunk"): "kda.kda.chunk_kda_fwd",
    ("gdn", "conv1d"): "gdn.fused_chunk_parallel.fused_conv1d_gdn",
    ("gdn", "chunk"): "gdn.gated_delta.chunked_gated_delta_rule_jax",
    ("gdn", "fused_recurrent"): "gdn.gated_delta.ragged_gated_delta_rule_ref",
    ("gdn", "decode"): "gdn.gated_delta.decode_gated_delta_rule_ref",
    ("decode", "fused_recurrent"): "simple_gla.simple_gla_fused.decode_simple_gla_fused",
}
"""(op, variant) -> the entry point under ``sgl_jax.srt.kernels`` (gdn with the convolution: ``("gdn",
"conv1d")``; the decode candidate's: ``("decode", ...)``)."""



def _import_kernels() -> tuple[dict, str | None]:
    """The kernel modules, imported when this module is (outside any trace: docs/legs.md), and why not."""
    if importlib.util.find_spec("sgl_jax") is None:
        return {}, f"sglang-jax is not installed ({INSTALL})"
    try:
        return {module: importlib.import_module(f"{KERNELS}.{module}")
                for module in sorted({entry.rpartition(".")[0] for entry in ENTRY.values()})}, None
    except Exception as exc:  # noqa: BLE001 - any import failure is the reason for every row
        return {}, f"sglang-jax's kernels could not be imported: {type(exc).__name__}: {exc}"


_MODULES, IMPORT_ERROR = _import_kernels()


def _entry(key) -> object:
    module, _, name = ENTRY[key].rpartition(".")
    return getattr(_MODULES[module], name)


def _installed() -> str | None:
    return IMPORT_ERROR


def _gdn_key(case) -> tuple[str, str]:
    """gdn's entry point: the fused kernel with the convolution; without it, the decode form when every request
    is one token from a carried state (its production decode), else the case's variant's pure-JAX form."""
    if delta_rule.conv_width(case):
        return ("gdn", "conv1d")
    if case.variant == "fused_recurrent" and case.h0 and set(mapping.requests(case)[1]) == {1}:
        return ("gdn", "decode")
    return ("gdn", case.variant)


def _state_dtype(a):
    """The state pool's dtype: h0's (float32, or a ``state_dtype`` case's bf16 or fp16: the cache sglang-jax's
    model runner allocates in its configured dtype), float32 without h0. Its simple_gla and kda entry points take
    h0 as given; whatever dtype a kernel hands the state back in, the serving wrapper writes it back in the
    cache's (harness.ops.serving)."""
    import jax.numpy as jnp

    return jnp.asarray(a["h0"]).dtype if a.get("h0") is not None else jnp.float32


def _call(fn, *args, **kwargs):
    """``fn(*args, **kwargs)``; sgl_jax's own input checks, raised before anything runs, become refusals in its
    words; anything raised inside jax or later propagates (an ``error`` row)."""
    try:
        return fn(*args, **kwargs)
    except (AssertionError, ValueError, NotImplementedError) as exc:
        if not _raised_by_sgl_jax(exc):
            raise
        raise NotImplementedError(f"sglang-jax refuses the case: {type(exc).__name__}: {exc}") from None


def _raised_by_sgl_jax(exc: BaseException) -> bool:
    """Whether the innermost frame of ``exc`` is a ``raise`` or ``assert`` line in sgl_jax's source."""
    import linecache
    from pathlib import Path

    import sgl_jax

    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    filename = tb.tb_frame.f_code.co_filename
    if not Path(filename).resolve().is_relative_to(Path(sgl_jax.__file__).resolve().parent):
        return False
    return linecache.getline(filename, tb.tb_lineno).lstrip().startswith(("raise ", "assert "))


def _packed(case, x):
    """A [B, T, ...] array as the one packed row [1, B·T, ...] the varlen-only kernels take."""
    return x.reshape((1, case.B * case.T) + tuple(x.shape[2:]))


def _cu_seqlens(case):
    import jax.numpy as jnp

    return jnp.asarray(mapping.requests(case)[0], jnp.int32)


# --------------------------------------------------------------------------------------------- simple_gla
def supports_simple_gla(case) -> str | None:
    why = _installed()
    if why or (case.op, case.variant) not in ENTRY:
        return why or f"sglang-jax has no entry point for {case.op}.{case.variant}"
    if case.variant == "chunk" and any(gate.kind == "g" for gate in case.gates):
        return ("sglang-jax's simple_gla_fwd takes g_gamma [H] only (a per-token g raises 'g should be None'); "
                "this case has a per-token g")
    return None


def forward_simple_gla(case, a, ctx):
    import jax.numpy as jnp

    del ctx  # the candidate leg forces interpret mode itself
    g_gamma = gated.per_head_gamma(a.get("g_gamma"), case.H)
    if case.variant == "chunk":
        o, ht = _call(_entry(("simple_gla", "chunk")), _packed(case, a["q"]), _packed(case, a["k"]),
                      _packed(case, a["v"]), g_gamma=g_gamma, scale=case.resolved_scale, h0=a.get("h0"),
                      use_ht=case.final_state, cu_seqlens_dev=_cu_seqlens(case), chunk_size=case.chunk_size)
        return {"o": o.reshape(a["v"].shape[:2] + o.shape[2:]), "ht": ht}
    cu = None if case.cu_seqlens is None else jnp.asarray(case.cu_seqlens, jnp.int32)
    o, ht = _call(_entry(("simple_gla", "fused_recurrent")), a["q"], a["k"], a["v"], g=a.get("g"),
                  g_gamma=g_gamma, scale=case.resolved_scale, initial_state=a.get("h0"),
                  output_final_state=case.final_state, cu_seqlens=cu)
    return {"o": o, "ht": ht}


# ---------------------------------------------------------------------------------------------------- kda
KDA_REFUSED = {"use_qk_l2norm_in_kernel": "q and k as given (its own assert)",
               "use_beta_sigmoid_in_kernel": "beta as probabilities",
               "allow_neg_eigval": "no allow_neg_eigval",
               "conv1d": "no convolution in front"}


def supports_kda(case) -> str | None:
    why = _installed()
    if why or (case.op, case.variant) not in ENTRY:
        return why or f"sglang-jax has no entry point for {case.op}.{case.variant}"
    given = [f"{name} ({reason})" for name, reason in KDA_REFUSED.items() if case.opt.get(name)]
    if given:
        return f"sglang-jax's chunk_kda takes " + "; ".join(given)
    return None


def forward_kda(case, a, ctx):
    import jax.numpy as jnp

    del ctx
    gate = {}
    if delta_rule.gate_in_kernel(case):
        # A_log [H] and dt_bias [H, K], as Kimi-Linear's layer passes them (kda_backend.py)
        gate = dict(use_gate_in_kernel=True, A_log=jnp.asarray(a["A_log"]),
                    dt_bias=jnp.asarray(a["dt_bias"]).reshape(case.HV, case.K), lower_bound=case.opt.get("lower_bound"))
    out = _call(_entry(("kda", "chunk")), _packed(case, a["q"]), _packed(case, a["k"]), _packed(case, a["v"]),
                _packed(case, a["g"]), _packed(case, a["beta"]), case.resolved_scale, a.get("h0"), case.final_state,
                _cu_seqlens(case), chunk_size=case.chunk_size, **gate)
    o, ht = out[0], out[1]  # a 12-tuple: o, final state, then its intermediates
    return {"o": o.reshape(a["v"].shape[:2] + o.shape[2:]), "ht": ht}


# ---------------------------------------------------------------------------------------------------- gdn
def supports_gdn(case) -> str | None:
    why = _installed()
    if why:
        return why
    key = _gdn_key(case)
    return tpu_inference.serving_refusal(case, f"sglang-jax's {ENTRY[key].rpartition('.')[2]}")


def forward_gdn(case, a, ctx):
    del ctx
    if delta_rule.conv_width(case):
        return tpu_inference.conv1d_gdn(case, a, _entry(("gdn", "conv1d")), read_slots_apart=False, batched=False)
    import jax.numpy as jnp

    B, T, H, K = a["q"].shape
    HV, V = a["v"].shape[2:]
    offsets, lengths = mapping.requests(case)
    N = len(lengths)
    tokens = lambda x: jnp.asarray(x).reshape((B * T,) + x.shape[2:])  # noqa: E731
    pool = jnp.zeros((N + 1, HV, K, V), _state_dtype(a))
    if case.h0:
        pool = pool.at[1:].set(jnp.asarray(a["h0"]))
    key = _gdn_key(case)
    slots, fresh = jnp.arange(1, N + 1, dtype=jnp.int32), jnp.full((N,), bool(case.h0))
    common = dict(n_kq=H, n_v=HV, d_k=K, d_v=V)
    if key == ("gdn", "decode"):
        requests, common["has_initial_state"] = (slots,), fresh
    else:
        requests = (jnp.asarray(offsets, jnp.int32), slots, fresh)
    if key == ("gdn", "chunk"):
        common["chunk_size"] = case.chunk_size
    pool_out, o = _call(_entry(key), tokens(delta_rule.pack_qkv(case, a, jnp.concatenate)), tokens(a["beta"]),
                        tokens(a["g"]), pool, jnp.asarray(a["A_log"], jnp.float32),
                        jnp.asarray(a["dt_bias"], jnp.float32), *requests, **common)
    return {"o": o.reshape(B, T, HV, V).astype(a["q"].dtype), "ht": pool_out[1:]}


def describe(case) -> dict:
    key = _gdn_key(case) if case.op == "gdn" else (case.op, case.variant)
    out = {"entry": f"{KERNELS}.{ENTRY.get(key, 'none')}"}
    if key in (("simple_gla", "fused_recurrent"), ("gdn", "chunk"), ("gdn", "fused_recurrent"), ("gdn", "decode")):
        out["ran_as"] = "pure JAX (XLA), every dot at its stated precision through the MXU model"
    else:
        out["ran_as"] = "Pallas, interpreted with the MXU model"
    return out


# ------------------------------------------------------------------------------------------------- decode
def supports_decode(case) -> str | None:
    why = _installed()
    if why:
        return why
    if (case.op, case.variant) != ("simple_gla", "fused_recurrent"):
        return ("sglang-jax's decode_simple_gla_fused is simple_gla's decode step (simple_gla.fused_recurrent); "
                f"not {case.op}.{case.variant}")
    if any(gate.kind == "g" for gate in case.gates):
        return "decode_simple_gla_fused takes g_gamma [H] only, no per-token g"
    if any(n != 1 for n in mapping.requests(case)[1]):
        return "decode_simple_gla_fused runs one token per request: every request of the case must have one"
    return None


def forward_decode(case, a, ctx):
    import jax.numpy as jnp

    del ctx
    B, T, H, K = a["q"].shape
    V = a["v"].shape[-1]
    N = B * T
    spare = N + 1  # named by no request: must come back untouched
    pool = jnp.zeros((N + 2, H, K, V), _state_dtype(a))
    if case.h0:
        pool = pool.at[1:N + 1].set(jnp.asarray(a["h0"]))
    pool = pool.at[spare].set(jnp.full((H, K, V), 0.5, pool.dtype))
    kept = pool[spare:spare + 1]
    o, pool_out = _call(_entry(("decode", "fused_recurrent")), a["q"].reshape(N, H, K), a["k"].reshape(N, H, K),
                        a["v"].reshape(N, H, V), pool, jnp.arange(1, N + 1, dtype=jnp.int32),
                        jnp.full((N,), bool(case.h0)), g_gamma=gated.per_head_gamma(a["g_gamma"], H),
                        scale=case.resolved_scale)
    mapping.check_kept(kept, pool_out[spare:spare + 1], [spare], "decode_simple_gla_fused's state pool")
    return {"o": o.reshape(B, T, H, V), "ht": pool_out[1:N + 1]}


class SglangJax:
    """The implementation object (:mod:`harness.legs.external`)."""

    distribution = "sglang-jax"  # the rows' version: sglang-jax's, not this project's (which ships the binding)
    bindings = {"simple_gla": LegBinding(forward_simple_gla, supports_simple_gla, describe=describe,
                                         differentiable=False),
                "kda": LegBinding(forward_kda, supports_kda, describe=describe, differentiable=False),
                "gdn": LegBinding(forward_gdn, supports_gdn, describe=describe, differentiable=False)}


class SglangJaxDecode(SglangJax):
    bindings = {"simple_gla": LegBinding(
        forward_decode, supports_decode, differentiable=False,
        describe=lambda case: {"entry": f"{KERNELS}.{ENTRY[('decode', 'fused_recurrent')]}",
                               "state_pool": "request i in slot 1 + i; slot 0 its dummy; a spare slot kept"})}


IMPLEMENTATION = SglangJax()
DECODE = SglangJaxDecode()
