"""The TPU leg: ``kernels_tpu`` Pallas kernels, native on a TPU, interpreted on CPU.

Native when JAX sees a TPU device. Otherwise the same bindings run in Pallas
TPU interpret mode with uninitialised memory poisoned with NaN (a kernel that
reads scratch or output it never wrote yields NaN, which always fails) and the
MXU rounding model of ``kernels_tpu.mxu`` switched on, so float32 dots round
as the matrix unit would instead of XLA:CPU's exact float32.

Gradients come from ``jax.vjp`` through the kernels' ``custom_vjp`` with the
case's ``do`` (and ``dht``, zeros when the case has none).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from cases.case import Case
from cases.inputs import Inputs
from harness.ops.base import OpDescriptor, grad_name

from .base import Environment, Leg, LegOutput, cotangent_pairs


@dataclass(frozen=True)
class TpuContext:
    """Passed to TPU bindings: how to run the kernels."""

    interpret: Any  # None natively, a pltpu.InterpretParams in interpret mode
    mxu_model: bool


def tpu_available() -> bool:
    import jax

    try:
        return bool(jax.devices("tpu"))
    except RuntimeError:
        return False


class TpuLeg(Leg):
    name = "tpu"

    def __init__(self, force_interpret: bool = False):
        self.native = tpu_available() and not force_interpret

    def context(self) -> TpuContext:
        if self.native:
            return TpuContext(interpret=None, mxu_model=False)
        from jax.experimental.pallas import tpu as pltpu

        return TpuContext(interpret=pltpu.InterpretParams(uninitialized_memory="nan"), mxu_model=True)

    def environment(self) -> Environment:
        import jax
        import jaxlib

        ctx = self.context()
        device = jax.devices()[0].device_kind if self.native else "cpu (Pallas TPU interpret mode)"
        return Environment(
            mode="native" if self.native else "emulated",
            device=device,
            versions={"jax": jax.__version__, "jaxlib": jaxlib.__version__},
            settings={"interpret": repr(ctx.interpret),
                      "mxu_model": "bf16 passes per lax.Precision (kernels_tpu.mxu)" if ctx.mxu_model
                      else "hardware"},
        )

    def run(self, op: OpDescriptor, case: Case, inputs: Inputs) -> LegOutput:
        import jax
        import jax.numpy as jnp

        binding = op.tpu
        ctx = self.context()
        arrays = {name: jnp.asarray(a) for name, a in inputs.arrays.items()}  # same bits, bf16 included
        diff_names = op.differentiable(case)
        primals = {n: arrays[n] for n in diff_names}
        rest = {n: a for n, a in arrays.items() if n not in primals}

        def forward(p):
            out = binding.forward(case, {**rest, **p}, ctx)
            return {name: value for name, value in out.items() if value is not None}

        outputs, vjp = jax.vjp(forward, primals)
        cotangents = {}
        for out_name, cot_name in cotangent_pairs(op, case, outputs):
            value = outputs[out_name]
            cot = arrays.get(cot_name) if cot_name else None
            cotangents[out_name] = jnp.zeros_like(value) if cot is None else cot.astype(value.dtype)
        (grads,) = vjp(cotangents)
        tensors = {name: np.asarray(value) for name, value in outputs.items()}
        for n in diff_names:
            g = grads.get(n)
            tensors[grad_name(n)] = None if g is None else np.asarray(g)
        return LegOutput(tensors=tensors, details=dict(binding.describe(case)))
