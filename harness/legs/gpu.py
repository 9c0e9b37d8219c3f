"""The GPU leg: flash-linear-attention's Triton kernels, native on CUDA, emulated on CPU.

Native when torch sees a CUDA device; otherwise the very same bindings run
under the Triton interpreter inside ``harness.emulation.triton_emulation``,
the scoped set of interpreter fixes (deterministic configs, tensor loop
variables, bf16 arithmetic with round-to-nearest-even, f32 dot accumulation,
TF32 rounding of f32 dot inputs). Native runs pin autotuning the same way, so
both modes use the same configs and reduction order.

Gradients come from ``torch.autograd.grad`` with the case's ``do`` (and
``dht``); a gradient autograd does not produce is ``not_provided``.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np

from cases.case import Case
from cases.inputs import Inputs
from harness.ops.base import OpDescriptor, grad_name

from .base import Environment, Leg, LegOutput, cotangent_pairs

DOT_PRECISIONS = (None, "tf32", "tf32x3", "ieee")


def to_torch(a: np.ndarray, device: str):
    """numpy (bf16 via ml_dtypes) -> torch, bit for bit."""
    import torch

    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16).to(device)
    return torch.from_numpy(a.copy()).to(device)


def to_numpy(t) -> np.ndarray:
    """torch -> numpy, bit for bit (bf16 comes back as ml_dtypes.bfloat16)."""
    import torch

    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


FLA_DISPATCH_ENV = "FLA_DISABLE_BACKEND_DISPATCH"
def compiled_builtins_problem() -> str | None:
    """Why fla cannot run interpreted in this process, when another library imported ``triton.language`` before
    the GPU leg turned interpreter mode on: Triton decorates its own built-ins (``tl.sum``, ``tl.cdiv``...) when
    ``triton.language`` is first imported, so they stay compiled ``JITFunction``s, and an interpreted kernel that
    calls one fails ("Cannot call @triton.jit'd outside of the scope of a kernel") on every case."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    if isinstance(tl.sum, InterpretedFunction):
        return None
    return ("triton.language was imported before the GPU leg put this process in Triton interpreter mode (by "
            "another leg's library), so Triton's built-ins are compiled and no fla kernel can run interpreted: run "
            "the GPU leg in a process of its own (parity run --backend gpu), or that other leg in another command")


class GpuLeg(Leg):
    """fla's Triton kernels: native on CUDA, else through the Triton interpreter (harness/emulation)."""

    def __init__(self, dot_precision: str | None = None, force_emulation: bool = False,
                 batched_grid: bool = True):
        """``dot_precision`` plays TRITON_F32_DEFAULT for f32 dots that do not set
        ``input_precision`` themselves; None keeps the process setting (else tf32),
        exactly as a native run resolves it. ``batched_grid`` (emulated runs): all
        programs of a launch in one interpreter pass (True, the default: the batched
        executor, harness/emulation/batched_grid.py) or the interpreter's stock loop,
        one program after another (False); the rows are bit for bit the same."""
        self.batched_grid = bool(batched_grid)
        self.layouts_dir = None  # the emulation's compiled-layouts cache: :meth:`keep_caches_under`
        if dot_precision not in DOT_PRECISIONS:
            raise ValueError(f"{dot_precision=} must be one of {DOT_PRECISIONS}")
        from harness.emulation import emulation_problem, enable_interpreter_mode, native_cuda_available

        self.dot_precision = dot_precision
        self.native = native_cuda_available() and not force_emulation
        if self.native and dot_precision is not None:
            os.environ["TRITON_F32_DEFAULT"] = dot_precision  # read when kernels compile
        # fla may dispatch some ops (kda) to non-Triton backends; it reads this at import
        imported_before, value_before = "fla" in sys.modules, os.environ.get(FLA_DISPATCH_ENV)
        os.environ.setdefault(FLA_DISPATCH_ENV, "1")
        self.refusal = None  # why every case is refused: the whole leg cannot measure fla here
        if os.environ[FLA_DISPATCH_ENV] != "1":
            self.refusal = (f"{FLA_DISPATCH_ENV}={os.environ[FLA_DISPATCH_ENV]!r}: fla may run an op on a "
                            f"non-Triton backend; the GPU leg measures fla's Triton kernels (set it to 1)")
        elif imported_before and value_before != "1":
            self.refusal = (f"fla was imported before {FLA_DISPATCH_ENV}=1 was set, so its backend "
                            "dispatch is active: run the GPU leg in a fresh process")
        if not self.native and self.refusal is None:
            self.refusal = emulation_problem()
        if not self.native:
            # Triton decides interpreted vs compiled when a kernel is decorated:
            # this must happen before fla is first imported in the process.
            enable_interpreter_mode()
            if self.refusal is None:
                self.refusal = compiled_builtins_problem()
            # fla warns that it "rolls back to CPU" when Triton has no GPU: this leg asked for exactly that
            # (every row says emulated), so the warning only alarms
            warnings.filterwarnings("ignore", message="Triton is not supported on current platform",
                                    category=UserWarning)
            import fla.ops  # noqa: F401 - load the kernels now so scoped emulation patches reach them

    def keep_caches_under(self, root) -> None:
        """The emulation keeps the layouts it compiles (harness.emulation.reduce_order) under the caches' root."""
        from harness.emulation.reduce_order import LAYOUTS_SUBDIR

        self.layouts_dir = None if root is None else Path(root) / LAYOUTS_SUBDIR

    def supports(self, op: OpDescriptor, case: Case) -> str | None:
        return self.refusal or super().supports(op, case)

    def _scope(self):
        from harness.emulation import pinned_autotune, triton_emulation

        if self.native:
            return pinned_autotune()
        return triton_emulation(dot_precision=self.dot_precision, batched_grid=self.batched_grid,
                                layouts_dir=self.layouts_dir)

    def environment(self) -> Environment:
        from harness.emulation import triton_versions

        if self.native:
            import torch

            device = torch.cuda.get_device_name()
        else:
            device = "cpu (Triton interpreter)"
        return Environment(
            mode="native" if self.native else "emulated",
            device=device,
            versions=triton_versions(),
            settings={"dot_precision": self.dot_precision or os.environ.get("TRITON_F32_DEFAULT") or "tf32",
                      "autotune": "pinned: first config after the kernel's pruning"},
        )

    def binding(self, op: OpDescriptor):
        return op.fla

    def run(self, op: OpDescriptor, case: Case, inputs: Inputs) -> LegOutput:
        import torch

        device = "cuda" if self.native else "cpu"
        binding = self.binding(op)
        tensors = {name: to_torch(a, device) for name, a in inputs.arrays.items()}
        diff_names = op.differentiable(case)
        for n in diff_names:
            tensors[n].requires_grad_(True)
        with self._scope() as scope:
            outputs = {k: v for k, v in binding.forward(case, tensors).items() if v is not None}
            outs, cots = [], []
            for out_name, cot_name in cotangent_pairs(op, case, outputs):
                value = outputs[out_name]
                cot = tensors.get(cot_name) if cot_name else None
                outs.append(value)
                cots.append(torch.zeros_like(value) if cot is None else cot.to(value.dtype))
            backward_error = None
            try:
                grads = (torch.autograd.grad(outs, [tensors[n] for n in diff_names], cots, allow_unused=True)
                         if diff_names else ())  # a forward-only case (a decode variant) differentiates nothing
            except Exception as exc:  # noqa: BLE001 - the forward's numbers are real: keep them, the gradients err
                grads, backward_error = (), exc
        result = {name: to_numpy(value) for name, value in outputs.items()}
        for n, g in zip(diff_names, grads):
            result[grad_name(n)] = None if g is None else to_numpy(g)
        details = dict(binding.describe(case))
        if case.cu_seqlens is not None:
            details["cu_seqlens"] = list(case.cu_seqlens)  # passed to fla as a torch.long tensor on the device
        details["triton_configs"] = scope.configs_summary()
        details["emulation"] = scope.settings
        return LegOutput(tensors=result, details=details, backward_error=backward_error)
