"""What the gated delta rule ops (kda, gdn, gdn2) share: their inputs, compared tensors and reference binding.

kda and gdn run ``S_t = S'_t + beta_t k_t (v_t - S'_tᵀ k_t)ᵀ`` after a decay ``S'_t``; they differ in the gate's
shape (kda: one log decay per key channel, [B,T,HV,K]; gdn: one per head, [B,T,HV]) and in the in-kernel gate's
parameters. gdn2 takes kda's decay and replaces beta by two gates, an erase gate ``b`` per key channel and a write
gate ``w`` per value channel: ``S_t = S'_t + k_t (w_t v_t - S'_tᵀ (b_t k_t))ᵀ``. Each descriptor says those
differences (its gates' names and draws: ``gates``, default kda's and gdn's beta) and asks these helpers for the
rest.
"""

from __future__ import annotations

from typing import Callable

from cases.case import Case
from cases.inputs import InputSpec, gate_law, l2normed_normal, normal, sigmoid_normal

from .base import (TensorSpec, call_tpu_kernel, fla_varlen, forward_tensors, grad_tensors, qkv_specs,
                   state_and_cotangent_specs)
from .reductions import Reduction, ReductionSpec, trailing

Shape = Callable[[Case], tuple]
DECODE = "fused_recurrent"
CONV_OPTIONS = ("conv1d", "conv1d_bias")
"""The short causal convolution in front of the delta rule (fla's ``ShortConvolution``, as its GatedDeltaNet and
KDA layers apply it): ``conv1d=W`` convolves q, k and v per channel with a kernel of width W, then SiLU;
``conv1d_bias`` adds a bias. Both ops take them; neither is an option of fla's op function, whose inputs the
convolution makes (:func:`conv_inputs`)."""
CONV_OPTION_DOCS = {
    "conv1d": "the layer's short causal convolution in front of the op (fla's ShortConvolution): q, k and v are "
              "convolved per channel with a kernel of this width (2 to 8), then SiLU; it adds the inputs "
              "conv_weight and conv_h0 and the output conv_ht (not a keyword of fla's op function)",
    "conv1d_bias": "that convolution with a bias (the input conv_bias); needs conv1d",
}
"""What each of :data:`CONV_OPTIONS` means (the descriptors' ``options``)."""
QK_NORM_DOC = ("q and k are drawn N(0,1) and L2-normalised inside the op (fla's keyword of the same name); "
               "without it they are drawn already normalised")
BETA_SIGMOID_DOC = ("beta is drawn as logits N(0,1) and squashed by a sigmoid inside the op; without it beta is "
                    "drawn as sigmoid(N(0,1))")
NEG_EIGVAL_DOC = "beta doubled, in (0, 2): the layer's negative eigenvalues (fla needs the in-kernel sigmoid with it)"
CONV_WIDTHS = range(2, 9)
VARIANTS = ("chunk", DECODE)
"""``chunk``: fla's chunk kernels, forward and backward. ``fused_recurrent``: the decode path, forward only (fla's
``fused_recurrent_*`` kernels raise in backward: serving never differentiates), token by token on fla's side."""
DTYPES = {"q": "case", "k": "case", "v": "case", "g": "float32", "beta": "case", "b": "case", "w": "case",
          "h0": "float32", "A_log": "float32", "dt_bias": "float32", "conv_weight": "case", "conv_bias": "case", "conv_h0": "case"}


def forward_only(case: Case) -> bool:
    """The decode variant compares o and ht only."""
    return case.variant == DECODE


def validate_variant(case: Case) -> None:
    """The variant, the decode variant's forward-only rule, and the one gate both ops take (no second gate)."""
    if case.variant not in VARIANTS:
        raise ValueError(f"{case.op} {case.variant=} must be one of {VARIANTS}")
    if case.gamma is not None:
        raise ValueError(f"{case.op} takes one gate, a per-token g; it has no g_gamma: drop {case.gamma.label}")
    if forward_only(case) and case.dht:
        raise ValueError(f"{case.op}.{DECODE} is forward only (fla's fused_recurrent kernels have no backward): "
                         f"drop dht")


def gate_in_kernel(case: Case) -> bool:
    return bool(case.opt.get("use_gate_in_kernel", False))


def inputs(case: Case, opts: dict, g_shape: Shape, dt_bias_shape: Shape,
           gates: list[InputSpec] | None = None) -> list[InputSpec]:
    """q, k, v, the gates after g, do in the case dtype; g (``g_shape``), A_log [HV], dt_bias (``dt_bias_shape``),
    h0, dht in float32. With the in-kernel options the raw inputs are drawn: q, k ~ N(0,1) (else already
    L2-normalised), g ~ N(0,1) (else fla's log-sigmoid gate law). ``gates``: the op's gates after g, drawn in
    that order; default beta [B,T,HV], as logits with ``use_beta_sigmoid_in_kernel`` (else sigmoid(N(0,1)))."""
    g_law = normal() if opts["use_gate_in_kernel"] else gate_law
    if gates is None:
        gates = [InputSpec("beta", lambda c: (c.B, c.T, c.HV), "case",
                           normal() if opts["use_beta_sigmoid_in_kernel"] else sigmoid_normal)]
    specs = qkv_specs(case, qk_law=normal() if opts["use_qk_l2norm_in_kernel"] else l2normed_normal) + [
        InputSpec("g", g_shape, "float32", g_law), *gates]
    if opts["use_gate_in_kernel"]:
        specs.append(InputSpec("A_log", lambda c: (c.HV,), "float32", normal()))
        specs.append(InputSpec("dt_bias", dt_bias_shape, "float32", normal()))
    return specs + conv_specs(case) + state_and_cotangent_specs(case)


BETA = ("beta",)
"""The gates after g of kda and gdn."""


def differentiable(case: Case, gates: tuple[str, ...] = BETA) -> list[str]:
    """q, k, v, g, the gates (default beta); A_log and dt_bias with the in-kernel gate; conv1d's inputs; h0 when
    given. None for the decode variant."""
    if forward_only(case):
        return []
    names = ["q", "k", "v", "g", *gates]
    if gate_in_kernel(case):
        names += ["A_log", "dt_bias"]
    names += [spec.name for spec in conv_specs(case)]
    return names + (["h0"] if case.h0 else [])


def tensors(case: Case, gates: tuple[str, ...] = BETA):
    conv_state = [TensorSpec("conv_ht", "case", "output", "final conv state [N,D,W-1]: each sequence's last W-1 "
                             "inputs of q, k, v (their exact bits)")] if conv_width(case) and case.final_state else []
    specs = forward_tensors(case) + conv_state + grad_tensors(case, differentiable(case, gates), DTYPES)
    return [ReductionSpec(s.name, s.dtype, s.kind, s.doc, reduction=GATE_SUMS[s.name]) if s.name in GATE_SUMS else s
            for s in specs]


# ------------------------------------------------------------------ the in-kernel gate's parameters: sums
def _gate_input(x: dict):
    """``g + dt_bias``, the in-kernel gate's argument per token (dt_bias [HV*K] or [HV] viewed as g's trailing
    axes)."""
    import numpy as np

    g = np.asarray(x["g"], dtype=np.float64)
    return g + np.asarray(x["dt_bias"], dtype=np.float64).reshape(g.shape[2:])


def dt_bias_terms(op, case: Case, x: dict, golden: dict):
    """ddt_bias's terms: dt_bias enters the gate only as ``g + dt_bias``, so each token's term is the reference's
    gradient of the raw gate ``dg`` there; summed over B and T."""
    import numpy as np

    dg = np.asarray(golden["dg"])
    return dg.reshape(dg.shape[:2] + (-1,))


def a_log_terms(op, case: Case, x: dict, golden: dict):
    """dA_log's terms, one per token and channel: ``dg * (dG/dA_log) / (dG/dg)`` with G the in-kernel gate of
    x = g + dt_bias: with ``lower_bound``, ``G = lower_bound * sigmoid(exp(A_log) x)`` and the ratio is ``x``;
    without, ``G = -exp(A_log) softplus(x)`` and it is ``softplus(x) / sigmoid(x)`` (the gates of
    references.kda and references.gdn; :func:`harness.ops.reductions.magnitudes` checks the terms sum to the
    reference's dA_log). Summed over B, T and (kda) K."""
    import numpy as np

    xg = _gate_input(x)
    if case.opt.get("lower_bound") is not None:
        ratio = xg
    else:
        ratio = np.logaddexp(0.0, xg) * (1.0 + np.exp(-xg))  # softplus(x) / sigmoid(x)
    return trailing(np.asarray(golden["dg"]) * ratio, [2])


GATE_SUMS = {
    "dA_log": Reduction("each token's and key channel's term dg * dG/dA_log / dG/dg of the in-kernel gate G, over "
                        "B, T and (kda) K", a_log_terms),
    "ddt_bias": Reduction("the raw gate's gradient dg of each token, over B and T", dt_bias_terms),
}
"""The in-kernel gate's parameters are shared by every token: their gradients are sums over the tokens."""


def reference(fwd, bwd, case: Case, x: dict, method: str, compute_dtype: str, opts: dict,
              gates: tuple[str, ...] = BETA) -> dict:
    """The float64 reference binding: ``fwd`` (o, ht) and ``bwd`` (a dict of gradients) of a references module,
    called as ``(q, k, v, g, *gates, ...)`` with the case's options; the compared gradients of
    :func:`differentiable`."""
    common = dict(scale=case.resolved_scale, initial_state=x.get("h0"), chunk_size=case.chunk_size,
                  method=method, compute_dtype=compute_dtype, A_log=x.get("A_log"), dt_bias=x.get("dt_bias"),
                  cu_seqlens=case.cu_seqlens, **opts)
    conv = conv_width(case) and _ReferenceConv(case, x, compute_dtype)
    if conv:
        x = {**x, **conv.outputs}
    qkvgb = (x["q"], x["k"], x["v"], x["g"], *(x[name] for name in gates))
    o, ht = fwd(*qkvgb, output_final_state=True, **common)
    names = differentiable(case, gates)
    grads = bwd(*qkvgb, x["do"], x.get("dht"), **common) if names else {}
    extra = {}
    if conv:
        extra["conv_ht"] = conv.final_state
        grads = {**grads, **(conv.gradients(grads) if names else {})}
    return {"o": o, "ht": ht, **extra, **{"d" + n: grads["d" + n] for n in names}}


def gate_params(case: Case, t: dict) -> dict:
    """A_log and dt_bias, as keywords, when the case gates in the kernel."""
    return dict(A_log=t["A_log"], dt_bias=t["dt_bias"]) if gate_in_kernel(case) else {}


def pallas_forward(case: Case, a: dict, ctx, chunk: Callable, decode: Callable, opts: dict,
                   gates: tuple[str, ...] = BETA) -> dict:
    """The TPU leg's run of a delta-rule op: the convolution (:func:`pallas_conv`), then ``chunk``, the op's chunk
    kernels (differentiable), or for the decode variant ``decode``, its fused-recurrent kernel, forward only, as
    fla decodes (no chunks, no dots); called as ``(q, k, v, g, *gates, ...)`` with ``opts`` (fla's keywords) and
    the in-kernel gate's parameters. Each op's own binding imports its kernels and passes them: a binding's
    cache fingerprint follows the imports of the module its function lives in (harness.run.baseline_cache)."""
    extra = gate_params(case, a)
    a, conv_state = pallas_conv(case, a)
    if forward_only(case):
        fn, tiling = decode, {}
    else:
        fn, tiling = chunk, dict(chunk_size=case.chunk_size, mxu_model=ctx.mxu_model)
    o, ht = call_tpu_kernel(fn, case, a["q"], a["k"], a["v"], a["g"], *(a[name] for name in gates),
                            scale=case.resolved_scale, initial_state=a.get("h0"), output_final_state=case.final_state,
                            interpret=ctx.interpret, **tiling, **opts, **extra)
    return {"o": o, "ht": ht, **conv_state}


# ------------------------------------------------------------------ the short convolution (conv1d=W)
def conv_width(case: Case) -> int:
    """The case's convolution width W, 0 without one."""
    return int(case.opt.get("conv1d", 0))


def conv_channels(case: Case) -> int:
    """D, the channels the convolution runs over: q's, k's and v's heads flattened and concatenated in that order
    (fla's layers convolve each with its own ShortConvolution; per channel, that is one convolution over the
    concatenation, which is the qkv layout vLLM TPU's fused kernel takes)."""
    return 2 * case.H * case.K + case.HV * case.V


def per_sequence(case: Case) -> frozenset:
    """The convolution's per-sequence arrays ([N,D,W-1]: its state in and out, and the state's gradient)."""
    return frozenset({"conv_h0", "conv_ht", "dconv_h0"}) if conv_width(case) else frozenset()


def gradient_lookahead(case: Case) -> int:
    """W-1 with the convolution (input token t feeds the convolved tokens t..t+W-1), 0 without."""
    return max(conv_width(case) - 1, 0)


def kernel_options(case: Case) -> dict:
    """The case's options less the convolution's, which no op function takes."""
    return {name: value for name, value in case.opt.items() if name not in CONV_OPTIONS}


def validate_conv(case: Case) -> None:
    """The convolution options' rules: a width in :data:`CONV_WIDTHS`, the bias only with a width, and q, k
    normalised in the op (the convolution's output is not unit-norm; the delta rule's state stays bounded only
    with unit keys, which is why fla's layers normalise after the convolution)."""
    opts = case.opt
    if "conv1d" in opts:
        W = opts["conv1d"]
        if isinstance(W, bool) or not isinstance(W, int) or W not in CONV_WIDTHS:
            raise ValueError(f"{case.op} option conv1d={W!r} is the convolution's width: an integer in "
                             f"[{CONV_WIDTHS.start}, {CONV_WIDTHS.stop - 1}] (fla's default is 4)")
        if not opts.get("use_qk_l2norm_in_kernel"):
            raise ValueError(f"{case.op} option conv1d needs use_qk_l2norm_in_kernel=1: q and k are normalised after "
                             f"the convolution, as fla's layers do")
    if "conv1d_bias" in opts:
        if not isinstance(opts["conv1d_bias"], bool):
            raise ValueError(f"{case.op} option conv1d_bias={opts['conv1d_bias']!r} must be a bool")
        if "conv1d" not in opts:
            raise ValueError(f"{case.op} option conv1d_bias needs conv1d=<width>")


def conv_specs(case: Case) -> list[InputSpec]:
    """With ``conv1d=W``: the weight [D,W] ~ N(0, 1/W) (the scale of fla's ShortConvolution's initialisation),
    the bias [D] with ``conv1d_bias``, and with ``h0`` each sequence's conv state [N,D,W-1] (the inputs before
    its first token), all in the case dtype, in which a layer holds them."""
    W = conv_width(case)
    if not W:
        return []
    specs = [InputSpec("conv_weight", lambda c: (conv_channels(c), W), "case", normal(W ** -0.5))]
    if case.opt.get("conv1d_bias"):
        specs.append(InputSpec("conv_bias", lambda c: (conv_channels(c),), "case", normal()))
    if case.h0:
        specs.append(InputSpec("conv_h0", lambda c: (c.state_shape[0], conv_channels(c), W - 1), "case", normal()))
    return specs


def pack_qkv(case: Case, t, cat) -> object:
    """q, k, v of ``t`` as one [B,T,D] array (:func:`conv_channels`'s order); ``cat(list, axis)`` is the
    framework's concatenation (numpy's, jax's or torch's)."""
    B, T = t["q"].shape[:2]
    return cat([t[name].reshape(B, T, -1) for name in ("q", "k", "v")], -1)


def unpack_qkv(case: Case, y) -> dict:
    """The inverse of :func:`pack_qkv`: {q, k, v} from [B,T,D]."""
    B, T = y.shape[:2]
    hk = case.H * case.K
    return {"q": y[..., :hk].reshape(B, T, case.H, case.K), "k": y[..., hk:2 * hk].reshape(B, T, case.H, case.K),
            "v": y[..., 2 * hk:].reshape(B, T, case.HV, case.V)}


class _ReferenceConv:
    """The float64 convolution of a case's q, k, v (:mod:`references.conv1d`), and the chain rule back through it."""

    def __init__(self, case: Case, x: dict, compute_dtype: str):
        import numpy as np

        from references.conv1d import causal_conv1d

        self.case, self.x = case, x
        self.xin = pack_qkv(case, x, np.concatenate)
        self.kw = dict(initial_state=x.get("conv_h0"), activation="silu", cu_seqlens=case.cu_seqlens,
                       compute_dtype=compute_dtype)
        y, self.final_state = causal_conv1d(self.xin, x["conv_weight"], x.get("conv_bias"), output_final_state=True,
                                            **self.kw)
        self.outputs = unpack_qkv(case, y)

    def gradients(self, grads: dict) -> dict:
        """dq, dk, dv of the raw inputs and the convolution's own (dconv_weight, dconv_bias, dconv_h0) from the
        delta rule's gradients of the convolved q, k, v."""
        import numpy as np

        from references.conv1d import causal_conv1d_bwd

        dy = pack_qkv(self.case, {n: grads["d" + n] for n in ("q", "k", "v")}, np.concatenate)
        g = causal_conv1d_bwd(self.xin, self.x["conv_weight"], self.x.get("conv_bias"), dy, **self.kw)
        return {**{"d" + n: v for n, v in unpack_qkv(self.case, g["dx"]).items()},
                "dconv_weight": g["dweight"], "dconv_bias": g["dbias"], "dconv_h0": g["dh0"]}


def fla_conv(case: Case, t: dict) -> tuple[dict, dict]:
    """fla's ``causal_conv1d`` (SiLU, as its layers call it) on the case's q, k, v: ``(t with the convolved q, k,
    v, {"conv_ht": final state})``; ``(t, {})`` without ``conv1d``. fla's state is [N,D,W] with one unread
    column in front (:mod:`references.conv1d`): the case's state goes in behind a zero column, and that column
    of the final state is dropped."""
    if not conv_width(case):
        return t, {}
    import torch
    import torch.nn.functional as F
    from fla.modules.causal_conv1d import causal_conv1d

    h0 = t.get("conv_h0")
    y, ht = causal_conv1d(pack_qkv(case, t, torch.cat), weight=t["conv_weight"], bias=t.get("conv_bias"),
                          initial_state=None if h0 is None else F.pad(h0, (1, 0)), output_final_state=True,
                          activation="silu", **fla_varlen(case, t["q"]))
    return {**t, **unpack_qkv(case, y)}, {"conv_ht": ht[..., 1:]}


def pallas_conv(case: Case, a: dict) -> tuple[dict, dict]:
    """The TPU kernels' convolution (:mod:`kernels_tpu.conv1d`), as :func:`fla_conv` returns fla's."""
    if not conv_width(case):
        return a, {}
    import jax.numpy as jnp

    from kernels_tpu.conv1d import causal_conv1d

    y, ht = causal_conv1d(pack_qkv(case, a, jnp.concatenate), a["conv_weight"], a.get("conv_bias"), a.get("conv_h0"),
                          "silu", cu_seqlens=case.cu_seqlens)
    return {**a, **unpack_qkv(case, y)}, {"conv_ht": ht}
