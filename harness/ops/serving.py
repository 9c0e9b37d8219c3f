"""Serving semantics as case features, on every op and every leg: a pooled state buffer, and decode steps that
continue a prefill.

A serving engine does not hand a kernel one initial state per request and take one final state back. It keeps
every request's recurrent state in a pooled buffer, tells the kernel which slot each request reads and which it
writes (and whether it has a state at all), and runs a request's first tokens through the chunk kernel (the
prefill) and each later token through a one-token decode kernel, from the state the previous call left. Two case
options say so; any op takes them, and a case without them is run exactly as before.

``pool=S``: the recurrent state lives in a buffer of S slots. ``h0`` is the pool before the call and ``ht`` the
pool after it, both [S,HV,K,V] (``dht`` and ``dh0`` too: the gradient of the pool). The slots (:func:`slots`):

- request i writes its final state into slot ``2i+1``;
- an even request reads the slot it writes (a decode continuing in place), an odd one reads slot ``2i`` (a copy
  a prefix cache left: read and write slots differ);
- every third request (``i % 3 == 2``) is new: its has-initial-state flag is false and it starts from zeros,
  whatever its read slot holds;
- S >= 2N + 1: slot 2N and the even slots of even requests are named by no request. Every slot no request writes
  comes back bit for bit (:attr:`Slots.kept`).

``decode=n``: request i's last ``min(n, len_i)`` tokens are decode steps, one token per call through the op's
decode variant (:attr:`OpDescriptor.decode_variant`), each call starting from the state the previous one returned;
the tokens before them are its prefill, one call of the case's own variant. Step j packs one token of every
request that still has one (a request with fewer decode tokens joins later, so all end together; one with none
is a zero-length request of that step). The maths is the op's on the whole sequence, so the float64 reference
computes it in one call; the legs run the chain, so the error a decode step adds to the prefill's state is what
they are measured on. A decode case compares the forward only (o and ht), as the decode variants do.

``state_dtype=bf16|fp16`` (fp32, the default, is every case without it): the dtype of the state cache, as a
serving engine's setting (vLLM's ``mamba_ssm_cache_dtype``, tpu-inference's ``TPU_MAMBA_SSM_CACHE_DTYPE``) chooses
it. ``h0`` (the pool before the call with ``pool=S``) is drawn in it, and ``ht`` (the pool after) is declared in it,
so each is judged in that dtype. Every leg gets the state in that dtype and the wrapper writes each state a call
returns back in it, rounded to nearest even, as the engine's ``cache[slot] = ht.to(cache.dtype)`` does: after the
call (before the pool's scatter) and between a prefill and each decode step. What a kernel keeps inside one call
is its own (fla's kernels and this project's carry it in float32). A state cache serves the forward: a
``state_dtype`` case compares o and ht, as a decode case does. A binding whose library cannot take a state in that
dtype says so in :attr:`LegBinding.state_dtype` (the case's rows become ``unsupported`` with the reason). The
float64 reference keeps the state exact from the same rounded ``h0`` (docs/definitions.md, "A low-precision state
cache"): each leg's rounding of the state is part of its error.

The legs need no code for any of them: :func:`served` wraps an op's descriptor (the registry serves every op wrapped)
and :func:`served_binding` a candidate's binding. The wrapped bindings gather each request's state from the pool
and scatter the final states back with the framework's own ops (torch, jax), so the gradients flow through them
as they would in a serving engine's step; the reference does the same in float64 and its chain rule by hand
(:func:`pool_gradient`).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from cases.case import DTYPES, Case
from cases.inputs import InputSpec

from .base import LegBinding, OpDescriptor, TensorSpec, per_token

OPTIONS = ("pool", "decode", "state_dtype")
"""The serving options: any op's case takes them (:func:`split`)."""
OPTION_DOCS = {
    "pool": "the recurrent state lives in a pool of this many slots: h0 and ht are the pool before and after the "
            "call; request i writes slot 2i+1 and reads it (even i) or slot 2i (odd i), and every third request is "
            "new (no initial state)",
    "decode": "each request's last n tokens are one-token decode steps through the op's decode variant, each from "
              "the state the previous step returned; the tokens before them are its prefill",
    "state_dtype": "the dtype of the state cache (bf16 or fp16; fp32, the default, is a case without the option): "
                   "h0 (or the pool before the call) is drawn in it, every state a call returns is written back "
                   "rounded to it (between a prefill and its decode steps too), and ht (or the pool after) is "
                   "judged in it; the reference keeps the state exact, so the rounding is part of each leg's error; "
                   "forward only (o and ht)",
}
"""What each serving option means, in every op (:func:`served` adds them to each descriptor's ``options``)."""


@dataclass(frozen=True)
class Slots:
    """Where each request's state comes from and goes to in a pool of ``size`` slots."""

    size: int
    read: tuple[int, ...]
    write: tuple[int, ...]
    has_initial_state: tuple[bool, ...]

    @property
    def kept(self) -> tuple[int, ...]:
        """The slots no request writes: they come back bit for bit."""
        return tuple(s for s in range(self.size) if s not in self.write)

    def asdict(self) -> dict:
        return {"pool_slots": self.size, "read": list(self.read), "write": list(self.write),
                "has_initial_state": list(self.has_initial_state)}


STATE_DTYPES = {label: name for name, label in DTYPES.items() if name != "float32"}
"""The ``state_dtype`` option's values (a case dtype's label) and the dtype each names; float32, the default, is
a case without the option (one case, one id)."""
DEFAULT_STATE_DTYPE = "float32"


def state_dtype(case: Case) -> str:
    """The dtype name of the case's state cache: its ``state_dtype`` option's, float32 without one."""
    label = split(case)[1].get("state_dtype")
    return DEFAULT_STATE_DTYPE if label is None else STATE_DTYPES[label]


def forward_only(case: Case) -> bool:
    """Whether a serving option makes the case compare its forward only (decode steps, a state cache's dtype)."""
    serving = split(case)[1]
    return "decode" in serving or "state_dtype" in serving


def split(case: Case) -> tuple[Case, dict[str, Any]]:
    """The case without its serving options (what an op's own code and bindings see: one state per request) and
    those options."""
    serving = {k: v for k, v in case.options if k in OPTIONS}
    if not serving:
        return case, {}
    return case.replace(options=tuple((k, v) for k, v in case.options if k not in OPTIONS)), serving


def inner(case: Case) -> Case:
    return split(case)[0]


def is_served(case: Case) -> bool:
    """Whether the case has a serving option (a pool, decode steps)."""
    return bool(split(case)[1])


def slots(case: Case) -> Slots | None:
    """The pool's slots of a ``pool=S`` case (the rule in the module's doc), None without a pool."""
    size = split(case)[1].get("pool")
    if size is None:
        return None
    n = case.num_seqs
    return Slots(size=size, write=tuple(2 * i + 1 for i in range(n)),
                 read=tuple(2 * i + 1 if i % 2 == 0 else 2 * i for i in range(n)),
                 has_initial_state=tuple(i % 3 != 2 for i in range(n)))


def validate(op: OpDescriptor, case: Case) -> None:
    """ValueError (one line, with the fix) for serving options an op cannot take; then the op's own rules on the
    case without them."""
    base, serving = split(case)
    for name, value in serving.items():
        if name != "state_dtype" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"option {name}={value!r} must be a positive int")
    if "state_dtype" in serving:
        label = serving["state_dtype"]
        if label == DTYPES[DEFAULT_STATE_DTYPE] or label == DEFAULT_STATE_DTYPE:
            raise ValueError(f"state_dtype={label} is the default (a case without the option): drop it, so one case "
                             f"has one id")
        if label not in STATE_DTYPES:
            raise ValueError(f"option state_dtype={label!r} must be one of {tuple(STATE_DTYPES)} (the state cache's "
                             f"dtype; fp32 is the default)")
        if not case.h0:
            raise ValueError("state_dtype is the dtype of the state cache, which h0 holds (every binding reads the "
                             "cache's dtype from it; a request with no state is pool=S's has-initial-state False): "
                             "add h0")
        if case.dht:
            raise ValueError("state_dtype compares the forward only (a state cache serves the forward): drop dht")
    if "pool" in serving:
        need = 2 * case.num_seqs + 1
        if serving["pool"] < need:
            raise ValueError(f"pool={serving['pool']} slots: {case.num_seqs} requests write slots 1, 3, ..., "
                             f"{2 * case.num_seqs - 1} and read the even ones below, so the pool needs at least "
                             f"{need} (one slot no request names)")
        if not (case.h0 and case.final_state):
            raise ValueError("pool=S is read as h0 and written as ht: the case needs h0 and its final state "
                             "(drop noht, add h0)")
    if "decode" in serving:
        if op.decode_variant is None:
            raise ValueError(f"{op.name} has no decode variant for decode=n steps")
        if case.variant == op.decode_variant:
            raise ValueError(f"decode=n splits a prefill ({case.op}'s chunk variants) from its decode steps; "
                             f"{case.variant} is the decode variant itself: pass variant='chunk'")
        if case.dht:
            raise ValueError("decode=n compares the forward only (as the decode variants do): drop dht")
        if op.per_sequence(base):
            raise ValueError(f"decode=n hands the recurrent state from call to call, not "
                             f"{sorted(op.per_sequence(base))}: drop the option that adds them")
    op.validate(base)


# ----------------------------------------------------------------- the decode chain
@dataclass(frozen=True)
class Call:
    """One call of a decode chain: the case it runs and the token positions (of the whole case's T) it reads."""

    case: Case
    positions: tuple[int, ...]


def chain(op: OpDescriptor, case: Case, supports: Callable[[Case], "str | None"] = lambda c: None
          ) -> tuple[Call, ...]:
    """The calls a ``decode=n`` case runs, in order: the prefill (when any request has a token before its decode
    steps), then each decode step that has a token; each call's case is per request, without serving options.

    A step runs the op's decode variant when the leg's binding takes it (``supports``, the binding's); otherwise
    the prefill's variant on one token per request, as an engine whose only kernels are chunk kernels decodes."""
    base, serving = split(case)
    n = serving["decode"]
    lens = base.lens if base.lens is not None else (base.T,)
    starts = base.cu_seqlens if base.lens is not None else (0,)
    steps = [min(n, length) for length in lens]
    calls = []
    prefill = tuple(length - d for length, d in zip(lens, steps))
    if any(prefill):
        positions = tuple(p for s, m in zip(starts, prefill) for p in range(s, s + m))
        calls.append(Call(_tokens(base, prefill, base.variant, base.h0), positions))
    for j in range(n):
        takes = tuple(int(j >= n - d) for d in steps)
        if not any(takes):
            continue  # every request is shorter than the steps left: nothing to call
        state = base.h0 or bool(calls)
        positions = tuple(s + length - (n - j) for s, length, t in zip(starts, lens, takes) if t)
        step = _tokens(base, takes, op.decode_variant, state)
        if supports(step):
            step = step.replace(variant=base.variant)
        calls.append(Call(step, positions))
    return tuple(calls)


def _tokens(base: Case, lens: tuple[int, ...], variant: str, h0: bool) -> Case:
    """``base`` on ``lens`` tokens per request (packed) or per batch row (unpacked: one length), with its final
    state (the next call's initial state)."""
    shape = dict(T=lens[0]) if base.lens is None else dict(T=sum(lens), lens=lens)
    return base.replace(variant=variant, h0=h0, final_state=True, dht=False, **shape)


def _xp(a):
    """The array module of ``a``: torch, numpy or jax.numpy (a jax array or tracer)."""
    if type(a).__module__.startswith("torch"):
        import torch

        return torch
    if isinstance(a, np.ndarray):
        return np
    import jax.numpy as jnp

    return jnp


def write_back(state, dtype: str):
    """``state`` as a cache of ``dtype`` stores it: cast with the framework's own op (torch, jax, numpy), rounded
    to nearest even; unchanged when it is already in ``dtype`` or None."""
    if state is None:
        return None
    xp = _xp(state)
    if xp is np:
        from cases.inputs import NP_DTYPES

        return state if state.dtype == NP_DTYPES[dtype] else state.astype(NP_DTYPES[dtype])
    if xp.__name__ == "torch":
        return state.to(getattr(xp, dtype))
    return state.astype(xp.dtype(dtype))


def _cache(case: Case) -> Callable:
    """What the engine does to each state a call returns: written back in the cache's dtype with a
    ``state_dtype`` option, kept as returned without one (every case without it runs exactly as before)."""
    if "state_dtype" not in split(case)[1]:
        return lambda state: state
    return functools.partial(write_back, dtype=state_dtype(case))


def run_chain(op: OpDescriptor, case: Case, binding: LegBinding, t: Mapping[str, Any], *args) -> dict:
    """``binding``'s forward over :func:`chain`'s calls: each call gets the per-token inputs at its
    positions and the state the previous call returned, as the cache holds it (:func:`write_back`); o is put
    back in token order, ht is the last state."""
    base, cache = inner(case), _cache(case)
    pieces, order, state = [], [], t.get("h0")
    for call in chain(op, case, binding.supports):
        arrays = {name: a[:, list(call.positions)] if a is not None and per_token(base, a.shape) else a
                  for name, a in t.items() if name != "h0"}
        if state is not None:
            arrays["h0"] = state
        out = binding.forward(call.case, arrays, *args)
        pieces.append(out["o"])
        order.extend(call.positions)
        state = cache(out["ht"])
    xp = _xp(pieces[0])
    o = xp.concatenate(pieces, 1)[:, list(np.argsort(order, kind="stable"))]
    return {"o": o, "ht": state}


# ----------------------------------------------------------------- the pool
def gather(pool, s: Slots):
    """Each request's initial state: its read slot, or zeros when it has none."""
    xp = _xp(pool)
    return xp.stack([pool[r] if init else xp.zeros_like(pool[r]) for r, init in zip(s.read, s.has_initial_state)])


def scatter(pool, states, s: Slots):
    """The pool after the call: each request's final state in its write slot, every other slot as it was."""
    writer = {w: i for i, w in enumerate(s.write)}
    return _xp(pool).stack([states[writer[k]] if k in writer else pool[k] for k in range(s.size)])


def pool_gradient(dht_pool, dh0: np.ndarray | None, s: Slots, like: np.ndarray) -> np.ndarray:
    """The gradient of the pool before the call (numpy, the reference's chain rule): a slot no request writes
    passes its cotangent through (``dht_pool``, None for zeros); a written slot's old value reaches the output only
    through a request that read it, so every slot gets the gradients of the initial states read from it (a
    request with no initial state reads nothing)."""
    out = np.zeros_like(like) if dht_pool is None else np.array(dht_pool, copy=True)
    out[list(s.write)] = 0
    for i, (r, init) in enumerate(zip(s.read, s.has_initial_state)):
        if init and dh0 is not None:
            out[r] += dh0[i]
    return out


def _pool_shape(s: Slots) -> Callable[[Case], tuple]:
    return lambda c: (s.size, *inner(c).state_shape[1:])


# ----------------------------------------------------------------- wrapping a descriptor and its bindings
def served_forward(op: OpDescriptor, binding: LegBinding) -> Callable:
    """``binding``'s forward (``(case, tensors, *args) -> outputs``) with the case's serving options applied
    around it; a case without them calls it unchanged."""
    forward = binding.forward

    @functools.wraps(forward)
    def run(case: Case, t: Mapping[str, Any], *args):
        base, serving = split(case)
        if not serving:
            return forward(case, t, *args)
        t, s = dict(t), slots(case)
        pool = t.get("h0")
        if s is not None:
            t["h0"] = gather(pool, s)
        t.pop("dht", None)  # a cotangent: the leg applies it to the outputs, and it is pool-shaped here
        out = dict(run_chain(op, case, binding, t, *args) if "decode" in serving else forward(base, t, *args))
        if out.get("ht") is not None:
            out["ht"] = _cache(case)(out["ht"])
        if s is not None:
            out["ht"] = scatter(pool, out["ht"], s)
        return out

    return run


def _served_supports(op: OpDescriptor, binding: LegBinding) -> Callable:
    supports = binding.supports

    @functools.wraps(supports)
    def check(case: Case):
        base, serving = split(case)
        if "state_dtype" in serving:  # the library's own word on a state in that dtype first
            why = binding.state_dtype(state_dtype(case))
            if why:
                return why
        calls = [call.case for call in chain(op, case, supports)] if "decode" in serving else [base]
        return next((why for why in map(supports, calls) if why), None)

    return check


_SERVED: dict[tuple[str, LegBinding], LegBinding] = {}


def served_binding(op: OpDescriptor, binding: LegBinding | None) -> LegBinding | None:
    """A leg binding of ``op`` that takes serving cases; one per binding (a leg keeps its compiled programs per
    binding)."""
    if binding is None:
        return None
    if (op.name, binding) not in _SERVED:
        _SERVED[op.name, binding] = _serve(op, binding)
    return _SERVED[op.name, binding]


def _serve(op: OpDescriptor, binding: LegBinding) -> LegBinding:
    # each wrapper names what it wraps (functools.wraps): a leg's cache hashes the module of the op's own function
    @functools.wraps(binding.describe)
    def describe(case: Case) -> dict:
        details = dict(binding.describe(inner(case)))
        s, serving = slots(case), split(case)[1]
        if s is not None:
            details["pool"] = s.asdict()
        if "state_dtype" in serving:
            details["state_cache"] = state_dtype(case)
        if "decode" in serving:
            details["decode_chain"] = [f"{c.case.variant}:{'+'.join(map(str, c.case.lens or (c.case.T,)))}"
                                       for c in chain(op, case, binding.supports)]
        return details

    return dataclasses.replace(binding, forward=served_forward(op, binding),
                               supports=_served_supports(op, binding), describe=describe,
                               no_gradient=lambda case: binding.no_gradient(inner(case)))


def served(op: OpDescriptor) -> OpDescriptor:
    """``op`` taking the serving options on every leg: its inputs, tensors, validation, reference and bindings
    read the case without them, the pool and the decode chain applied around them."""

    def inputs(case: Case) -> list[InputSpec]:
        specs = op.inputs(inner(case))
        s = slots(case)
        if s is not None:  # h0 and dht are the pool and its cotangent
            specs = [dataclasses.replace(spec, shape=_pool_shape(s)) if spec.name in ("h0", "dht") else spec
                     for spec in specs]
        if "state_dtype" in split(case)[1]:  # h0 (the pool) drawn in the cache's dtype
            specs = [dataclasses.replace(spec, dtype=state_dtype(case)) if spec.name == "h0" else spec
                     for spec in specs]
        return specs

    def tensors(case: Case) -> list[TensorSpec]:
        only_forward, cached = forward_only(case), "state_dtype" in split(case)[1]
        return [dataclasses.replace(t, dtype=state_dtype(case)) if cached and t.name == "ht" else t
                for t in op.tensors(inner(case)) if not (only_forward and t.kind == "grad")]

    @functools.wraps(op.differentiable)
    def differentiable(case: Case) -> list[str]:
        return [] if forward_only(case) else op.differentiable(inner(case))

    @functools.wraps(op.reference)
    def reference(case: Case, x: Mapping[str, np.ndarray], *args, **kwargs) -> dict:
        base, serving = split(case)
        if not serving:
            return op.reference(case, x, *args, **kwargs)
        s, x = slots(case), dict(x)
        pool, dht_pool = x.get("h0"), x.get("dht")
        if s is not None:
            x["h0"] = gather(pool, s)
            if dht_pool is not None:
                x["dht"] = dht_pool[list(s.write)]
        out = dict(op.reference(base, x, *args, **kwargs))  # decode steps: the same maths, in one call
        if s is not None:
            out["ht"] = scatter(pool, out["ht"], s)
            if "dh0" in out:
                out["dh0"] = pool_gradient(dht_pool, out["dh0"], s, pool)
        names = {t.name for t in tensors(case)}
        return {k: v for k, v in out.items() if k in names}

    return dataclasses.replace(
        op, inputs=inputs, tensors=tensors, differentiable=differentiable, reference=reference,
        validate=functools.partial(validate, op),
        fla=served_binding(op, op.fla), pallas=served_binding(op, op.pallas),
        kernel_path=lambda case: op.kernel_path(inner(case)), options={**op.options, **OPTION_DOCS},
        per_sequence=lambda case: op.per_sequence(inner(case)),
        gradient_lookahead=lambda case: op.gradient_lookahead(inner(case)))
