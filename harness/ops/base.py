"""The op descriptor: everything the harness knows about one op, in one record.

A descriptor (our OpInfo) names the op's inputs and how they are drawn, the
tensors a case compares (outputs and gradients, each with its declared dtype),
the validation shared by every leg, and the three bindings: the float64
reference, the GPU (fla Triton) forward and the TPU (Pallas) forward.

The runner, comparator, reports and gate read descriptors only; none of them
mentions an op by name. Adding an op is: ``references/<op>.py``,
``kernels_tpu/<op>/``, ``harness/ops/<op>.py`` with its descriptor, and one
line in ``harness/ops/__init__.py``.

Binding contracts
-----------------
- ``reference(case, inputs64, method="chunk", compute_dtype="float64") ->
  dict[name, ndarray]``: every tensor of ``tensors(case)`` (forward and
  backward) from the float64 inputs; the defaults give the golden result.
- ``fla_forward(case, tensors) -> dict[name, torch.Tensor]`` and
  ``pallas_forward(case, arrays, ctx) -> dict[name, jax.Array]``: the forward
  outputs (``o``, ``ht``) from framework tensors that hold the case's exact bits.
  The leg takes gradients itself with the loss ``sum(o*do) + sum(ht*dht)`` and
  names the gradient of input ``x`` as ``d<x>``. A gradient the framework does
  not produce is reported ``not_provided``, never as zeros.
- Packed variable-length sequences (a case with ``lens``): state-shaped inputs
  and outputs (``h0``, ``dht``, ``ht``, ``dh0``) are ``case.state_shape`` =
  [N,H,K,V], one state per sequence. The reference gets
  ``cu_seqlens=case.cu_seqlens``; a GPU binding passes fla's ``cu_seqlens``
  (:func:`fla_varlen`), a TPU binding calls the kernels through
  :func:`call_tpu_kernel`, which adds ``cu_seqlens`` (a static tuple) and
  turns kernels that do not take it into a refusal. An unpacked case calls
  every function exactly as before (no ``cu_seqlens`` keyword at all).
- The state layout (a case with ``state_v_first``): the state-shaped tensors are [N,HV,V,K], fla's
  V-first layout. The fla binding passes fla's keyword (:func:`fla_state_layout`); the reference and the
  TPU-side legs call their bindings in the K-first layout, the legs transposing the state in and out
  (:func:`state_k_first`), so a reference or a kernel never needs to know.
- ``no_gradient(case) -> {input: reason}``: inputs of ``differentiable(case)`` whose gradient the binding
  gives none of by design (a parameter its forward takes as a constant); the runner makes their gradient rows
  ``not_provided`` with the reason, whatever the leg computed. Undeclared, a zero gradient is compared as any
  other (and fails its bound).
- ``*_supports(case) -> str | None``: ``None`` when the leg can run the case,
  otherwise the reason it cannot (the row becomes ``unsupported``). The TPU
  leg also asks the kernels themselves (``harness.legs.tpu.kernel_refusal``):
  a TPU binding states only what the kernels cannot know.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from cases.case import Case
from cases.inputs import InputSpec, Law, normal


@dataclass(frozen=True)
class TensorSpec:
    """A tensor the comparator checks: a forward output or an input gradient."""

    name: str  # "o", "ht", "dq", ...
    dtype: str  # declared dtype: "case" or a fixed name ("float32"); ULPs are counted in it
    kind: str  # "output" or "grad"
    doc: str = ""

    def resolve_dtype(self, case: Case) -> str:
        return case.dtype if self.dtype == "case" else self.dtype


Supports = Callable[[Case], "str | None"]


def always(case: Case) -> None:
    return None


@dataclass(frozen=True)
class LegBinding:
    """How one leg runs an op."""

    forward: Callable[..., Mapping[str, Any]]
    supports: Supports = always
    describe: Callable[[Case], Mapping[str, Any]] = lambda case: {}  # per-case facts for rows (mapping, dispatch)
    differentiable: bool = True  # False: a forward-only implementation; its gradient rows are not_provided
    # {input name: reason} of the case's differentiable inputs whose gradient the forward gives none of by design
    # (e.g. a parameter taken as a constant): their gradient rows are not_provided with the reason, not compared
    no_gradient: Callable[[Case], Mapping[str, str]] = lambda case: {}
    # a state cache's dtype (the serving option ``state_dtype``: "bfloat16", "float16") -> None when the library
    # takes h0 in it (and its state is written back in it after each call), else the reason it cannot: the case's
    # rows become unsupported with it (harness.ops.serving)
    state_dtype: Callable[[str], "str | None"] = lambda dtype: None


@dataclass(frozen=True)
class OpDescriptor:
    name: str
    variants: tuple[str, ...]
    doc: str
    inputs: Callable[[Case], list[InputSpec]]  # inputs of a case, in draw order
    tensors: Callable[[Case], list[TensorSpec]]  # compared tensors of a case: outputs then grads
    differentiable: Callable[[Case], list[str]]  # inputs whose gradient is compared, e.g. q k v g h0
    cotangents: Mapping[str, str]  # output -> its upstream-gradient input, e.g. {"o": "do", "ht": "dht"}
    validate: Callable[[Case], None]  # raises ValueError with a fix for a case no leg can run
    reference: Callable[..., Mapping[str, np.ndarray]]
    fla: LegBinding | None = None  # fla's Triton kernels (the baseline leg runs them)
    pallas: LegBinding | None = None  # this project's Pallas kernels (the built-in candidate leg runs them)
    notes: Mapping[str, str] = field(default_factory=dict)
    # the kernel path a case takes beyond its variant (gla: "fused" or "chunk" kernels), for coverage rules
    kernel_path: Callable[[Case], str] = lambda case: case.variant
    # inputs and outputs held one per packed sequence ([N,...]) besides the state-shaped ones (h0, ht, dht, dh0),
    # e.g. a conv state: the isolation check redraws entry i of each and compares the others bit for bit
    per_sequence: Callable[[Case], frozenset] = lambda case: frozenset()
    # how many tokens ahead a per-token input's gradient reads by the op's maths (0: input t feeds outputs <= t
    # through the state only; W-1 behind a causal convolution of width W): the causality check's cut for gradients
    gradient_lookahead: Callable[[Case], int] = lambda case: 0
    # the variant that runs one-token decode steps (fla's fused_recurrent kernels), for serving cases' decode
    # chains (harness.ops.serving); None: the op has none
    decode_variant: str | None = None
    # the case options the op takes, each with what it means in the op (``parity cases --explain``); the op's
    # ``validate`` refuses any other
    options: Mapping[str, str] = field(default_factory=dict)

    def tensor_names(self, case: Case) -> list[str]:
        return [t.name for t in self.tensors(case)]

    def binding_refusals(self, case: Case) -> dict[str, str]:
        """What each kernel binding already refuses of a valid ``case`` by its own ``supports`` (no kernel
        runs): binding field -> reason. A leg running that binding makes the case's rows ``unsupported``."""
        out = {}
        for f in dataclasses.fields(self):
            binding = getattr(self, f.name)
            if isinstance(binding, LegBinding):
                why = binding.supports(case)
                if why:
                    out[f.name] = why
        return out


def per_token(case: Case, shape) -> bool:
    """Whether ``shape`` is a per-token array's: [B,T,H,...] (q, k) or [B,T,HV,...] (v, o, the gate, beta)."""
    return len(shape) >= 3 and tuple(shape[:2]) == (case.B, case.T) and shape[2] in (case.H, case.HV)


def grad_name(input_name: str) -> str:
    """Name of the gradient of an input: q -> dq, g_gamma -> dg_gamma, h0 -> dh0."""
    return "d" + input_name


# ----------------------------------------------------------- shared helpers
def refuse_grouped_values(case: Case) -> None:
    """ValueError for a case with grouped value heads (HV > H) on an op that has none (fla's simple_gla and gla)."""
    if case.grouped_values:
        raise ValueError(f"{case.op} has no grouped value heads (HV={case.HV} > H={case.H}): fla's {case.op} takes "
                         f"v with q and k's H heads; drop HV (gdn and kda take it)")


def forward_tensors(case: Case) -> list[TensorSpec]:
    """o in the case dtype; ht (float32, as fla returns it) when final_state."""
    out = [TensorSpec("o", "case", "output", "output [B,T,HV,V]")]
    if case.final_state:
        out.append(TensorSpec("ht", "float32", "output",
                              "final state [N,HV,K,V] (N = B, or the packed sequences)"))
    return out


def grad_tensors(case: Case, differentiable: list[str], dtypes: Mapping[str, str]) -> list[TensorSpec]:
    """One gradient per differentiable input, declared in its input's dtype."""
    return [TensorSpec(grad_name(n), dtypes[n], "grad", f"gradient of {n}") for n in differentiable]


def qkv_specs(case: Case, qk_law: Law | None = None) -> list[InputSpec]:
    """q, k [B,T,H,K] and v [B,T,HV,V] in the case dtype; q, k ~ ``qk_law`` (default N(0,1)), v ~ N(0,1)."""
    qk_law = qk_law or normal()
    return [
        InputSpec("q", lambda c: (c.B, c.T, c.H, c.K), "case", qk_law),
        InputSpec("k", lambda c: (c.B, c.T, c.H, c.K), "case", qk_law),
        InputSpec("v", lambda c: (c.B, c.T, c.HV, c.V), "case", normal()),
    ]


def state_and_cotangent_specs(case: Case) -> list[InputSpec]:
    """h0 (float32) if the case has one, do [B,T,HV,V] (case dtype), dht (float32) if any.

    h0 and dht are ``case.state_shape`` = [N,HV,K,V]: one state per sequence (N = B unless packed, so an
    unpacked case draws exactly the arrays it always drew)."""
    specs = [InputSpec("h0", lambda c: c.state_shape, "float32", normal())] if case.h0 else []
    specs.append(InputSpec("do", lambda c: (c.B, c.T, c.HV, c.V), "case", normal()))
    if case.dht:
        specs.append(InputSpec("dht", lambda c: c.state_shape, "float32", normal()))
    return specs


STATE_TENSORS = ("h0", "dht", "ht", "dh0")
"""The state-shaped tensors of the contract (``case.state_shape``); a leg's gradient of ``h0`` is keyed ``h0``
before it is named ``dh0``."""


def state_k_first(case: Case, tensors: Mapping[str, Any]) -> dict:
    """``tensors`` with each state-shaped entry's last two axes swapped when the case lays its state out V-first
    (``state_v_first``), unchanged otherwise. The swap is its own inverse: a leg applies it to the inputs before
    calling a K-first binding and to what comes back. Works on numpy, jax and torch arrays alike."""
    if not case.state_v_first:
        return dict(tensors)
    return {name: value.swapaxes(-1, -2) if name in STATE_TENSORS and value is not None else value
            for name, value in tensors.items()}


def call_k_first(case: Case, fn: Callable, tensors: Mapping[str, Any], *args, **kwargs) -> dict:
    """``fn(case, tensors, *args, **kwargs)`` for a binding that takes and returns the state K-first (a reference,
    a Pallas forward), on and to the case's layout (:func:`state_k_first` on both sides). Under ``jax.vjp`` the
    swaps are differentiated with the rest: the gradient of a V-first ``h0`` comes out V-first."""
    return state_k_first(case, fn(case, state_k_first(case, tensors), *args, **kwargs))


def fla_state_layout(case: Case) -> dict:
    """fla's keyword for a V-first state, ``{"state_v_first": True}``; ``{}`` otherwise (fla's default)."""
    return {"state_v_first": True} if case.state_v_first else {}


def fla_float32_state(h0):
    """``h0`` (a torch tensor or None) widened to float32, exactly: fla 0.6.0's ``chunk_kda``, ``chunk_gla`` and
    ``chunk_gdn2`` assert a float32 ``initial_state``, so an engine that keeps a bf16 or fp16 state cache
    (``state_dtype``, harness.ops.serving) widens each state it reads before calling them; fla's other kernels
    widen it as they load it (``tl.load(...).to(tl.float32)``), the same values. A float32 h0 is returned as it is
    (the same tensor: its gradient flows as before)."""
    return None if h0 is None else h0.float()


def fla_varlen(case: Case, like) -> dict:
    """fla's keyword for a packed case: ``cu_seqlens``, a torch.long tensor of the N+1 offsets on the device of
    ``like`` (a tensor of the call); ``{}`` for an unpacked case. fla's optional ``cu_seqlens_cpu`` (a host
    copy that spares a device sync when fla builds its chunk indices) is not passed: same values, same
    kernels, and fused_chunk_simple_gla does not take it."""
    if case.cu_seqlens is None:
        return {}
    import torch

    return {"cu_seqlens": torch.tensor(case.cu_seqlens, dtype=torch.long, device=like.device)}


def takes_cu_seqlens(fn) -> bool:
    """Whether ``fn``'s signature names a ``cu_seqlens`` parameter (a ``**options`` catch-all does not count:
    kda's public functions take their options that way, and would reject it as an unknown option)."""
    import inspect

    try:
        return "cu_seqlens" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # no signature to read (a builtin): it does not say it takes the keyword
        return False


def call_tpu_kernel(fn, case: Case, *args, **kwargs):
    """``fn(*args, **kwargs)``, a ``kernels_tpu`` public function; a packed case adds ``cu_seqlens=case.cu_seqlens``
    (the N+1 offsets as a static tuple of ints).

    A kernel whose signature has no ``cu_seqlens`` parameter (:func:`takes_cu_seqlens`) does not take packed
    sequences: the call raises NotImplementedError, the kernels' own way of refusing a valid case, so the TPU
    leg's supports (``harness.legs.tpu.kernel_refusal``, which traces this call on shape-only inputs) and the
    compile leg report the case ``unsupported`` with the reason, never a number. Once a kernel names the
    keyword the same call runs it, and whatever it raises is its own error."""
    if case.cu_seqlens is None:
        return fn(*args, **kwargs)
    if not takes_cu_seqlens(fn):
        name = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', fn)}"
        raise NotImplementedError(f"{name} does not take cu_seqlens (packed variable-length sequences, "
                                  f"lens={'+'.join(map(str, case.lens))}): its signature has no such parameter")
    return fn(*args, cu_seqlens=case.cu_seqlens, **kwargs)
