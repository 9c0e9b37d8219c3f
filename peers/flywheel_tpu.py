"""flywheel-tpu (PyPI, import name ``flywheel_tpu``) as a candidate: its fused conv1d + gated delta rule serving
kernel on gdn, forward only.

``flywheel_tpu.linear_attention.gdn.wrapper.fused_conv1d_gdn`` is vLLM TPU's GDN v3 kernel (tpu-inference @
4420cae36157, vendored, "package imports rewritten to local"), with qkv entering the ``pallas_call`` in the caller's
layout and its own tile defaults (``mixed_tile_size=128``, ``compute_chunk_size=64``). Its signature is v3's, so the
case maps onto it as the ``tpu-inference-v3`` binding maps v3 (:func:`peers.tpu_inference.conv1d_gdn`, shared, not
copied): packed requests with the convolution in front, carried conv and recurrent states read from slots apart from
the ones written (``read_state_indices``, checked bit for bit), decode and verify windows in its batched segment.

Refused, with the reason: what v3's maths fixes (the kernel always convolves q, k, v with SiLU, normalises q and k,
computes the gate from ``A_log`` and ``dt_bias`` and squashes beta: a case maps only with ``conv1d=W`` and all three
in-kernel options; no ``allow_neg_eigval``; q scaled by K**-0.5 itself); a dtype other than bf16 (its own check:
"qkv must be bfloat16"; the shared mapping packs qkv in float32, cast back to bf16 here, exact for a bf16 case); kda (its ``fused_conv1d_kda`` is not bound
here: its gate and state layout need a mapping of their own); a missing install.

Install (its metadata asks for Python >= 3.12 and jax >= 0.11; its kernel modules import and run on 3.11 with jax
0.10.2): ``pip install --no-deps --ignore-requires-python flywheel-tpu==0.3.0``.
"""

from __future__ import annotations

import importlib
import importlib.util

from harness.ops import delta_rule
from harness.ops.base import LegBinding

from . import tpu_inference

VERSION = "0.3.0"
INSTALL = f"pip install --no-deps --ignore-requires-python flywheel-tpu=={VERSION}"
ENTRY = "flywheel_tpu.linear_attention.gdn.wrapper.fused_conv1d_gdn"


def _import():
    """The kernel, imported when this module is (outside any trace), and why not."""
    if importlib.util.find_spec("flywheel_tpu") is None:
        return None, f"flywheel-tpu is not installed ({INSTALL})"
    try:
        module, _, name = ENTRY.rpartition(".")
        return getattr(importlib.import_module(module), name), None
    except Exception as exc:  # noqa: BLE001 - any import failure is the reason for every row
        return None, f"flywheel-tpu could not be imported: {type(exc).__name__}: {exc}"


_KERNEL, IMPORT_ERROR = _import()


def supports(case) -> str | None:
    if IMPORT_ERROR:
        return IMPORT_ERROR
    if case.op != "gdn":
        return (f"flywheel-tpu's fused_conv1d_gdn is the gated delta rule with a scalar decay per head (gdn); "
                f"{case.op} does not map (its fused_conv1d_kda is not bound)")
    off = [f"{name}=0" for name in tpu_inference.SERVING_OPTIONS if not case.opt.get(name)]
    if off:
        return ("flywheel-tpu's fused_conv1d_gdn always normalises q, k, computes the gate from A_log and dt_bias "
                f"and squashes beta in the kernel; this case has {', '.join(off)}")
    if not delta_rule.conv_width(case):
        return "flywheel-tpu's fused_conv1d_gdn always convolves q, k, v first (SiLU after): a case maps with conv1d=W"
    if case.opt.get("allow_neg_eigval"):
        return "flywheel-tpu's fused_conv1d_gdn has no allow_neg_eigval"
    if case.scale is not None:
        return f"flywheel-tpu's fused_conv1d_gdn scales q by K**-0.5 itself; this case sets scale={case.scale}"
    if case.dtype != "bfloat16":
        return (f"flywheel-tpu's fused_conv1d_gdn takes qkv in bfloat16 only (its check: 'qkv must be bfloat16'); "
                f"this case is {case.dtype}")
    return None


def _bf16_qkv(qkv, *args, **kwargs):
    """Its kernel on the packed qkv in bfloat16, the one dtype it takes ("qkv must be bfloat16"): the shared mapping
    packs q, k, v in float32 (v3's dtype); for a bf16 case every value is a bf16 one, so the cast back is exact."""
    import jax.numpy as jnp

    return _KERNEL(qkv.astype(jnp.bfloat16), *args, **kwargs)


def forward(case, a, ctx):
    del ctx  # the candidate leg forces interpret mode itself
    return tpu_inference.conv1d_gdn(case, a, _bf16_qkv, read_slots_apart=True, batched=True)


def describe(case) -> dict:
    out = dict(tpu_inference.describe_v3(case))
    out["entry"] = ENTRY
    out["ran_as"] = "Pallas (vLLM TPU's GDN v3, vendored)"
    return out


class FlywheelTpu:
    """The implementation object (:mod:`harness.legs.external`)."""

    distribution = "flywheel-tpu"  # the rows' version: flywheel-tpu's, not this project's (which ships the binding)
    bindings = {"gdn": LegBinding(forward, supports, describe=describe, differentiable=False)}


IMPLEMENTATION = FlywheelTpu()
