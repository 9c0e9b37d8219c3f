"""Each op's argument contract, written once: simple_gla, gla, kda, gdn (the gated delta rule) and gdn2
(Gated DeltaNet-2).

``check_<op>`` validates one call from its arguments (shapes, dtypes, gates, chunk_size, scale,
packed sequence offsets ``cu_seqlens``) and returns ``(dims, scale)`` with the scale resolved;
``dims.N`` is the number of states (B, or the number of packed sequences). The references call it before computing,
the kernels before tracing and before their own limits (K, V lane multiples, dtypes, block sizes:
NotImplementedError). Gradients' cotangents ``do``/``dht`` are checked when given.

kda and gdn take grouped value heads (fla's GVA): v, do, the gate, beta, A_log, dt_bias and the state have
HV heads, a multiple of q and k's H (:func:`check_qkv`); simple_gla and gla do not.
"""

from __future__ import annotations

from typing import Mapping

from .checks import (Dims, check_chunk_size, check_floating, check_log_decay, check_qkv, described, expect,
                     resolve_scale, shape_of)


def check_gate_choice(g, g_gamma, g_layout, *, required: bool) -> None:
    """``g`` (per-token log decay, shape ``g_layout``), ``g_gamma`` (a constant log decay), or both (their log
    decays add, as in fla's ``chunk_simple_gla(q, k, v, g, g_gamma)``); one of them when ``required`` (else
    neither means no decay). Only which one is present is looked at."""
    per_token = "per-channel" if g_layout[-1] == "K" else "per-token"
    if required and g is None and g_gamma is None:
        raise ValueError(f"pass g [{','.join(g_layout)}] ({per_token} log decay), g_gamma (a constant log decay), "
                         f"or both")


def _check_g_gamma(g_gamma, layouts: tuple[str, ...], dims: Dims) -> None:
    """ValueError unless ``g_gamma`` is None or a floating array of one of ``layouts`` ("" a scalar, "H", "HK")."""
    if g_gamma is None:
        return
    if shape_of(g_gamma) not in {dims.shape(layout) for layout in layouts}:
        names = " or ".join(dims.name(layout) for layout in layouts)
        raise ValueError(f"g_gamma must be {names} (one log decay for every head, per head"
                         f"{', per head and key channel' if 'HK' in layouts else ''}), got {described(g_gamma)}")
    check_floating("g_gamma", g_gamma)


def _check_gated(g_layout: str, gamma_layouts: tuple[str, ...], required: bool, q, k, v, g, g_gamma, scale,
                 initial_state, chunk_size, do, dht, cu_seqlens) -> tuple[Dims, float]:
    """The contract of a gated op (simple_gla, gla): ``g`` of shape ``g_layout``, ``g_gamma`` of one of
    ``gamma_layouts``, or both, <= 0."""
    dims = check_qkv(q, k, v, initial_state=initial_state, do=do, dht=dht, cu_seqlens=cu_seqlens)
    check_gate_choice(g, g_gamma, g_layout, required=required)
    expect("g", g, g_layout, dims)
    _check_g_gamma(g_gamma, gamma_layouts, dims)
    check_log_decay("g", g)
    check_log_decay("g_gamma", g_gamma)
    check_chunk_size(chunk_size)
    return dims, resolve_scale(scale, dims.K)


def check_simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, chunk_size=64, *,
                     do=None, dht=None, cu_seqlens=None) -> tuple[Dims, float]:
    """simple_gla: g [B,T,H], g_gamma [] or [H] (one log decay for every head, or per head), or both (their log
    decays add); neither is no decay. All <= 0."""
    return _check_gated("BTH", ("", "H"), False, q, k, v, g, g_gamma, scale, initial_state, chunk_size, do, dht,
                        cu_seqlens)


def check_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, chunk_size=64, *,
              do=None, dht=None, cu_seqlens=None) -> tuple[Dims, float]:
    """gla: g [B,T,H,K], g_gamma [], [H] or [H,K] (broadcast over the tokens, and over the heads and channels it
    lacks), or both (their log decays add); at least one. All <= 0."""
    return _check_gated("BTHK", ("", "H", "HK"), True, q, k, v, g, g_gamma, scale, initial_state, chunk_size, do,
                        dht, cu_seqlens)


KDA_OPTIONS = dict(use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                   allow_neg_eigval=False, safe_gate=False, lower_bound=None)
"""fla's ``chunk_kda`` options and their defaults."""

GDN_OPTIONS = dict(use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                   allow_neg_eigval=False)
"""fla's ``chunk_gated_delta_rule`` options and their defaults (``A_log`` and ``dt_bias`` are arguments)."""


GDN2_OPTIONS = dict(use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, safe_gate=False, lower_bound=None)
"""fla's ``chunk_gdn2`` options and their defaults: kda's without the beta sigmoid and ``allow_neg_eigval`` (gdn2 has
no beta; ``A_log`` and ``dt_bias`` are arguments)."""


def _options(op: str, defaults: Mapping, options: Mapping) -> dict:
    """``options`` over ``defaults``; an unknown name is a TypeError (as an unknown keyword of ``op``)."""
    unknown = set(options) - set(defaults)
    if unknown:
        raise TypeError(f"{op} got unknown options {sorted(unknown)}")
    return {**defaults, **options}


def kda_options(options: Mapping) -> dict:
    """``options`` over :data:`KDA_OPTIONS`; an unknown name is a TypeError (as an unknown keyword)."""
    return _options("chunk_kda", KDA_OPTIONS, options)


def gdn_options(options: Mapping) -> dict:
    """``options`` over :data:`GDN_OPTIONS`; an unknown name is a TypeError (as an unknown keyword)."""
    return _options("chunk_gated_delta_rule", GDN_OPTIONS, options)


def gdn2_options(options: Mapping) -> dict:
    """``options`` over :data:`GDN2_OPTIONS`; an unknown name is a TypeError (as an unknown keyword)."""
    return _options("chunk_gdn2", GDN2_OPTIONS, options)


def _check_delta_rule(q, k, v, g, g_layout, beta, initial_state, do, dht, cu_seqlens) -> Dims:
    """What kda and gdn share: q, k, v with grouped value heads, the state and cotangents, the gate ``g`` of
    shape ``g_layout`` (its values are the op's business) and beta [B,T,HV]."""
    dims = check_qkv(q, k, v, initial_state=initial_state, do=do, dht=dht, cu_seqlens=cu_seqlens,
                     grouped_values=True)
    expect("g", g, g_layout, dims, required=True)
    expect("beta", beta, ("B", "T", "HV"), dims, required=True)
    return dims


def _check_kda_gate(g, opts: Mapping, A_log, dt_bias, dims: Dims) -> None:
    """kda's gate, per key channel, which gdn2 shares (fla's ``kda_gate_chunk_cumsum``): a log decay (<= 0)
    unless ``use_gate_in_kernel``; then g is the raw gate input (any sign), ``A_log`` [HV] is needed unless
    ``lower_bound`` is given, ``dt_bias`` is [HV*K], and ``lower_bound`` must be <= 0."""
    if opts["use_gate_in_kernel"]:
        lower_bound = opts["lower_bound"]
        if A_log is None and lower_bound is None:
            raise ValueError("A_log must be given when use_gate_in_kernel=True and lower_bound is None")
        expect("A_log", A_log, ("HV",), dims)
        expect("dt_bias", dt_bias, ("HV*K",), dims)
        if lower_bound is not None and lower_bound > 0:
            raise ValueError(f"lower_bound={lower_bound!r} makes the in-kernel gate lower_bound * sigmoid(...) a "
                             f"positive log decay, which is not a decay; pass lower_bound <= 0")
    else:
        check_log_decay("g", g)


def check_kda(q, k, v, g, beta, scale=None, initial_state=None, chunk_size=64, *, opts: Mapping | None = None,
              A_log=None, dt_bias=None, do=None, dht=None, cu_seqlens=None) -> tuple[Dims, float]:
    """kda: v [B,T,HV,V] (grouped value heads: HV a multiple of H), g [B,T,HV,K], beta [B,T,HV], the state
    [N,HV,K,V]; ``opts`` as :func:`kda_options` returns (defaults when None).

    g is a log decay (<= 0) unless ``use_gate_in_kernel``: then it is the raw gate input (any sign),
    ``A_log`` [HV] is needed unless ``lower_bound`` is given, ``dt_bias`` is [HV*K], and
    ``lower_bound`` (the decay's floor) must be <= 0. A_log and dt_bias are ignored otherwise, as in fla.
    fla's rules on the option combination (safe_gate, allow_neg_eigval) are the kernels' own."""
    opts = kda_options(opts or {})
    dims = _check_delta_rule(q, k, v, g, ("B", "T", "HV", "K"), beta, initial_state, do, dht, cu_seqlens)
    _check_kda_gate(g, opts, A_log, dt_bias, dims)
    check_chunk_size(chunk_size)
    return dims, resolve_scale(scale, dims.K)


def check_gdn(q, k, v, g, beta, scale=None, initial_state=None, chunk_size=64, *, opts: Mapping | None = None,
              A_log=None, dt_bias=None, do=None, dht=None, cu_seqlens=None) -> tuple[Dims, float]:
    """gdn (fla's ``chunk_gated_delta_rule``): v [B,T,HV,V] (grouped value heads: HV a multiple of H),
    g [B,T,HV] (one log decay per token and value head), beta [B,T,HV], the state [N,HV,K,V]; ``opts`` as
    :func:`gdn_options` returns (defaults when None).

    g is a log decay (<= 0) unless ``use_gate_in_kernel``: then it is the raw gate input (any sign),
    ``A_log`` [HV] is needed and ``dt_bias`` [HV] is optional. A_log and dt_bias are ignored otherwise, as
    in fla. As in fla, ``allow_neg_eigval`` needs ``use_beta_sigmoid_in_kernel``."""
    opts = gdn_options(opts or {})
    dims = _check_delta_rule(q, k, v, g, ("B", "T", "HV"), beta, initial_state, do, dht, cu_seqlens)
    if opts["allow_neg_eigval"] and not opts["use_beta_sigmoid_in_kernel"]:
        raise ValueError("allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True (it doubles the "
                         "sigmoid of beta); pass raw beta logits with use_beta_sigmoid_in_kernel=True")
    if opts["use_gate_in_kernel"]:
        if A_log is None:
            raise ValueError("A_log must be given when use_gate_in_kernel=True")
        expect("A_log", A_log, ("HV",), dims)
        expect("dt_bias", dt_bias, ("HV",), dims)
    else:
        check_log_decay("g", g)
    check_chunk_size(chunk_size)
    return dims, resolve_scale(scale, dims.K)


def check_gdn2(q, k, v, g, b, w, scale=None, initial_state=None, chunk_size=64, *, opts: Mapping | None = None,
               A_log=None, dt_bias=None, do=None, dht=None, cu_seqlens=None) -> tuple[Dims, float]:
    """gdn2 (fla's ``chunk_gdn2``, Gated DeltaNet-2): q, k, g [B,T,H,K], v [B,T,H,V], the erase gate b
    [B,T,H,K], the write gate w [B,T,H,V], the state [N,H,K,V]; ``opts`` as :func:`gdn2_options` returns
    (defaults when None). fla's gdn2 has no grouped value heads (it asserts v [B,T,H,V]): another head count
    of v is NotImplementedError, as for simple_gla and gla.

    The gate g is kda's (:func:`check_kda`): a log decay (<= 0) unless ``use_gate_in_kernel``; then the raw
    gate input, ``A_log`` [H] needed unless ``lower_bound`` is given, ``dt_bias`` [H*K], ``lower_bound`` <= 0.
    b and w are not range-checked (fla: typically [0, 1] or [0, 2]; neither fla nor the maths bounds them).
    fla's own limits (chunk_size 64, K <= 256, a float32 initial_state, safe_gate's lower_bound in [-5, 0))
    are its kernels' and are not part of the contract."""
    opts = gdn2_options(opts or {})
    dims = check_qkv(q, k, v, initial_state=initial_state, do=do, dht=dht, cu_seqlens=cu_seqlens)
    expect("g", g, ("B", "T", "HV", "K"), dims, required=True)
    expect("b", b, ("B", "T", "HV", "K"), dims, required=True)
    expect("w", w, ("B", "T", "HV", "V"), dims, required=True)
    _check_kda_gate(g, opts, A_log, dt_bias, dims)
    check_chunk_size(chunk_size)
    return dims, resolve_scale(scale, dims.K)
