"""Causality check: the future must not leak into the past, on any leg, for any op.

For a case and a cut position ``t0`` the leg runs twice: on the case's inputs,
and on inputs whose time-indexed forward tensors (every input of shape
[B, T, ...] that is not an upstream gradient: q, k, v, g, beta, ...) are
redrawn at positions ``t > t0``. The upstream gradients (``do``, ``dht``) stay
the same. Then ``o`` at positions ``t <= t0`` and ``dq`` at ``t <= t0 - r`` must not change, where ``r`` is
how far ahead an input token's gradient reads by the op's maths (``OpDescriptor.gradient_lookahead``: 0 for the
bare ops, W-1 behind a causal convolution of width W, whose input t feeds outputs t..t+W-1).

A chunked kernel masks future positions with exact zeros, so the result is
normally bit-exact; that is what is required (``max_abs_diff == 0``). Where a
kernel's reduction order makes bit-exactness impossible, the relative change
must stay below ``CAUSALITY_REL_BOUND`` (1e-6), three orders under the
smallest ε of any case dtype. A NaN in either run fails the check.

This catches the leak class tolerances miss: fla's "future gates of a chunk
leak into earlier outputs" bug moves o by far less than ε on random inputs.

Packed variable-length sequences (a case with ``lens``) are checked twice over:

- causality, as above, with the cut ``t0`` inside one sequence (:func:`default_t0`), so the
  unchanged past holds whole earlier sequences and the start of the cut one;
- isolation (rows with ``check = "isolation"``): every input token of one packed sequence i
  (every [B,T,H,...] input, ``do`` included) and its ``h0[i]`` and ``dht[i]`` are redrawn; every
  other sequence's rows of every per-token output and gradient (o, dq, dk, dv, dg, dbeta, ...) and
  its entries ``ht[j]``, ``dh0[j]`` must stay bit-exact (no tolerance: sequence j's computation
  never reads sequence i's data, so no reduction order can excuse a difference). Gradients of
  parameters every sequence shares (``g_gamma``, kda's ``A_log`` and ``dt_bias``) sum over the
  sequences and are not checked. The sequence redrawn is the middle one (it has neighbours on both
  sides: a state carried forward out of it and a state gradient carried backward out of it are
  both caught); with two sequences each is redrawn in turn. Rows name it in ``seq``; ``t0`` is -1.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from cases.case import Case
from cases.inputs import Inputs, input_shapes, inputs_sha256, make_inputs

from harness.ops.base import OpDescriptor, per_token
from harness.ops.serving import is_served
from harness.run.runner import Refusal, Runner
from harness.core.status import Status

CAUSALITY_REL_BOUND = 1e-6
CHECKED = ("o", "dq")


def checked_tensors(op: OpDescriptor | None, case: Case) -> list[str]:
    """:data:`CHECKED`, less a gradient the case does not compare (a forward-only decode variant has no dq)."""
    if op is None:
        return list(CHECKED)
    names = set(op.tensor_names(case))
    return [n for n in CHECKED if n in names]
CAUSALITY, ISOLATION = "causality", "isolation"


@dataclass(frozen=True)
class CausalityRow:
    case_id: str
    leg: str
    tensor: str
    t0: int
    max_abs_diff: float
    rel_diff: float
    bit_exact: bool
    status: str  # "ok", "leak", "unsupported", "error"
    reason: str
    mode: str
    input_sha256: str
    wall_s: float
    check: str = CAUSALITY  # "causality" (the future vs the past) or "isolation" (one packed sequence vs the others)
    seq: int = -1  # isolation: the packed sequence whose inputs were redrawn; -1 on causality rows


def _cut(n: int, C: int) -> int:
    """A cut inside a chunk of n tokens, past the first chunk when there are several."""
    return min(n - 2, C + C // 2 - 1) if n > C else n // 2 - 1


def default_t0(case: Case) -> int:
    """Cut inside a chunk, past the first one when there are several: both the
    intra-chunk mask and the inter-chunk state pass are exercised.

    Packed sequences: the cut lies inside one sequence (t0 and t0 + 1 both in it), chunks counted
    from its first token as the kernels count them; the sequence is the longest of those after the
    first (so a whole sequence lies in the unchanged past), or the first when it is alone."""
    if case.lens is None or all(n < 2 for n in case.lens):
        return _cut(case.T, case.chunk_size)
    i = max((i for i, n in enumerate(case.lens) if n >= 2), key=lambda i: (i > 0, case.lens[i], -i))
    return case.cu_seqlens[i] + _cut(case.lens[i], case.chunk_size)


def isolation_seqs(case: Case) -> tuple[int, ...]:
    """The packed sequences the isolation check redraws, one run each: the middle one (N >= 3), both
    (N = 2), none (unpacked, or a single sequence)."""
    n = case.num_seqs if case.lens is not None else 0
    return (n // 2,) if n >= 3 else tuple(range(n)) if n == 2 else ()


def perturb_future(op: OpDescriptor, case: Case, inputs: Inputs, t0: int) -> Inputs:
    """Redraw every time-indexed forward input ([B,T,H,...]) at positions > t0 (same laws, other seed)."""
    cotangent_names = set(op.cotangents.values())
    alt = make_inputs(case.replace(seed=case.seed + 7919), op.inputs(case))
    arrays = dict(inputs.arrays)
    for name, a in inputs.arrays.items():
        if name in cotangent_names or not per_token(case, a.shape):
            continue
        b = a.copy()
        b[:, t0 + 1:] = alt[name][:, t0 + 1:]
        arrays[name] = b
    return Inputs(arrays, inputs_sha256(arrays))


def perturb_sequence(op: OpDescriptor, case: Case, inputs: Inputs, i: int) -> Inputs:
    """Redraw packed sequence ``i``: every per-token input ([B,T,H,...], the upstream gradient ``do``
    included) on its tokens, and every per-sequence input ([N,H,K,V]: h0, dht) at index i (same laws,
    other seed). Parameters shared by every sequence (g_gamma, A_log, dt_bias) stay the same."""
    bos, eos = case.cu_seqlens[i], case.cu_seqlens[i + 1]
    alt = make_inputs(case.replace(seed=case.seed + 104729), op.inputs(case))
    arrays = dict(inputs.arrays)
    for name, a in inputs.arrays.items():
        layout = _layout(op, case, name, a.shape)
        if layout is None:
            continue
        b = a.copy()
        if layout == "token":
            b[:, bos:eos] = alt[name][:, bos:eos]
        else:
            b[i] = alt[name][i]
        arrays[name] = b
    return Inputs(arrays, inputs_sha256(arrays))


def _layout(op: OpDescriptor, case: Case, name: str, shape) -> str | None:
    """``"token"`` for a per-token array ([B,T,...]), ``"state"`` for a per-sequence one (``case.state_shape``, or
    an array the op declares per sequence, :attr:`OpDescriptor.per_sequence`: [N,...]), None for anything else (a
    parameter every sequence shares)."""
    shape = tuple(shape)
    if per_token(case, shape):
        return "token"
    if shape == tuple(case.state_shape) or name in op.per_sequence(case):
        return "state"
    return None


def _others(case: Case, a: np.ndarray, layout: str, i: int) -> np.ndarray:
    """The part of ``a`` that belongs to every packed sequence but ``i``."""
    bos, eos = case.cu_seqlens[i], case.cu_seqlens[i + 1]
    if layout == "token":
        return np.concatenate([a[:, :bos], a[:, eos:]], axis=1)
    return np.delete(a, i, axis=0)


def isolation_tensors(op: OpDescriptor, case: Case) -> list[str]:
    """The compared tensors the isolation check covers, from the declared input shapes: the outputs
    (per token or per sequence) and the gradients of per-token and per-sequence inputs."""
    shapes = {n: s for n, (s, _) in input_shapes(case, op.inputs(case)).items()}
    return [t.name for t in op.tensors(case)
            if t.kind != "grad" or _layout(op, case, t.name[1:], shapes.get(t.name[1:], ())) is not None]


def _diff(y0: np.ndarray, y1: np.ndarray) -> tuple[bool, float, float]:
    """(both finite, max |y1 - y0|, ||y1 - y0|| / ||y0||), infinite when not both finite."""
    finite = bool(np.isfinite(y0).all() and np.isfinite(y1).all())
    if not finite:
        return False, np.inf, np.inf
    max_abs = float(np.abs(y1 - y0).max()) if y0.size else 0.0
    norm = float(np.linalg.norm(y0))
    rel = float(np.linalg.norm(y1 - y0)) / norm if norm else (0.0 if max_abs == 0 else np.inf)
    return True, max_abs, rel


def check_case(runner: Runner, case: Case, t0: int | None = None) -> list[CausalityRow]:
    """Run the case twice through the runner's own steps (validation, inputs, supports, preflight,
    run) and compare ``o`` and ``dq`` up to ``t0``; a packed case then runs once more per sequence of
    :func:`isolation_seqs` and compares every other sequence's part of each tensor (isolation rows). The
    runner's leg is the leg checked; no golden is compared, so its reference cache stays empty."""
    leg = runner.leg
    t0 = default_t0(case) if t0 is None else t0
    mode = runner.provenance["mode"]
    seqs = isolation_seqs(case)

    def rows(op, status, reason, sha=""):
        return refused_rows(leg.name, mode, op, case, t0, status, reason, sha)

    def isolation_refusal(op, which, status, reason, sha):
        return _isolation_refused(leg.name, mode, op, case, which, status, reason, sha)

    # wall_s: the two leg runs compared (as the runner timed them: a run served by a leg cache keeps its own time)
    try:
        op, inputs = runner.prepare(case)
        base, base_columns = runner.execute(op, case, inputs)
        moved, moved_columns = runner.execute(op, case, perturb_future(op, case, inputs, t0))
    except Refusal as r:
        return rows(r.op, r.status, r.reason, r.columns.get("input_sha256", ""))
    base, base_wall = base.tensors, base_columns["wall_s"]
    out = _causality_rows(leg, case, t0, mode, inputs.sha256, base_wall + moved_columns["wall_s"], base,
                          moved.tensors, checked_tensors(op, case), op.gradient_lookahead(case))
    for i in seqs:
        try:
            moved, moved_columns = runner.execute(op, case, perturb_sequence(op, case, inputs, i))
        except Refusal as r:
            out += isolation_refusal(op, (i,), r.status, r.reason, inputs.sha256)
            continue
        out += _isolation_rows(leg, op, case, i, mode, inputs.sha256, base_wall + moved_columns["wall_s"], base,
                               moved.tensors)
    return out


def refused_rows(leg_name: str, mode: str, op: OpDescriptor | None, case: Case, t0: int, status: str, reason: str,
                 sha: str = "") -> list[CausalityRow]:
    """The rows of a case that could not be checked: each checked tensor, and each isolation check it has."""
    out = [CausalityRow(case.id, leg_name, n, t0, np.nan, np.nan, False, status, reason, mode, sha, 0.0)
           for n in checked_tensors(op, case)]
    seqs = isolation_seqs(case)
    if op is not None and seqs:
        out += _isolation_refused(leg_name, mode, op, case, seqs, status, reason, sha)
    return out


def _isolation_refused(leg_name, mode, op, case, which, status, reason, sha) -> list[CausalityRow]:
    try:
        names = isolation_tensors(op, case)
    except Exception:  # noqa: BLE001 - a broken descriptor still yields rows
        names = ["*"]
    return [CausalityRow(case.id, leg_name, n, -1, np.nan, np.nan, False, status, reason, mode, sha, 0.0,
                         ISOLATION, i) for i in which for n in names]


def _isolation_rows(leg, op, case, i, mode, sha, wall, base, moved) -> list[CausalityRow]:
    bos, eos = case.cu_seqlens[i], case.cu_seqlens[i + 1]
    out = []
    def row(name, status, why, max_abs=np.nan, rel=np.nan, exact=False):
        return CausalityRow(case.id, leg.name, name, -1, max_abs, rel, exact, status, why, mode, sha, wall,
                            ISOLATION, i)

    for name in isolation_tensors(op, case):  # not the gradient of a parameter every sequence shares
        if base.get(name) is None or moved.get(name) is None:
            out.append(row(name, Status.UNSUPPORTED, f"the {leg.name} leg does not return {name}"))
            continue
        y0, y1 = (np.asarray(x, dtype=np.float64) for x in (base[name], moved[name]))
        layout = _layout(op, case, name, y0.shape)
        if layout is None or y1.shape != y0.shape:
            out.append(row(name, Status.ERROR, f"{name} has shape {y0.shape}, neither per token [B,T,H,...] nor "
                                               f"per sequence {case.state_shape}"))
            continue
        finite, max_abs, rel = _diff(_others(case, y0, layout, i), _others(case, y1, layout, i))
        exact = finite and max_abs == 0.0
        where = f"rows outside tokens [{bos}, {eos})" if layout == "token" else f"entries j != {i}"
        if not finite:
            status, why = Status.LEAK, "NaN/Inf in an isolation run"
        elif exact:
            status, why = Status.OK, ""
        else:
            status, why = Status.LEAK, (f"{name} ({where}) changed when packed sequence {i} (its tokens, h0[{i}], "
                                        f"dht[{i}]) was redrawn: max |diff| {max_abs:.3g}, rel {rel:.3g}; "
                                        f"sequences must be bit-exactly isolated")
        out.append(row(name, status, why, max_abs, rel, exact))
    return out


def _causality_rows(leg, case, t0, mode, sha, wall, base, moved, names, lookahead=0) -> list[CausalityRow]:
    """``o`` up to ``t0``; a gradient up to ``t0 - lookahead`` (:attr:`OpDescriptor.gradient_lookahead`: an input
    token that feeds later outputs too has a gradient that reads their future)."""
    out = []
    for name in names:
        cut = t0 - (lookahead if name.startswith("d") else 0)
        if base.get(name) is None or moved.get(name) is None:
            out.append(CausalityRow(case.id, leg.name, name, t0, np.nan, np.nan, False, Status.UNSUPPORTED,
                                    f"the {leg.name} leg does not return {name}", mode, sha, wall))
            continue
        y0 = np.asarray(base[name], dtype=np.float64)[:, : cut + 1]
        y1 = np.asarray(moved[name], dtype=np.float64)[:, : cut + 1]
        finite, max_abs, rel = _diff(y0, y1)
        exact = finite and max_abs == 0.0
        if not finite:
            status, why = Status.LEAK, "NaN/Inf in a causality run"
        elif exact or rel <= CAUSALITY_REL_BOUND:
            status, why = Status.OK, "" if exact else f"not bit-exact: rel change {rel:.2e} <= {CAUSALITY_REL_BOUND:g}"
        else:
            status, why = Status.LEAK, (f"{name}[t<={cut}] changed when inputs after t0={t0} changed: max |diff| "
                                   f"{max_abs:.3g}, rel {rel:.3g} > {CAUSALITY_REL_BOUND:g}")
        out.append(CausalityRow(case.id, leg.name, name, t0, max_abs, rel, exact, status, why, mode, sha, wall))
    return out


CAUSALITY_CHUNKS = 3
"""A checked sequence spans at most this many chunks: two whole ones and its own last (partial) chunk, so the
intra-chunk mask, the inter-chunk state pass and the partial-chunk masking are all exercised; a longer
sequence adds more of the same chunk steps, not another kernel path."""


def _bounded(n: int, chunk: int) -> int:
    """A sequence of ``n`` tokens cut to at most CAUSALITY_CHUNKS chunks, keeping its last chunk's length."""
    last = n % chunk or chunk
    return min(n, (CAUSALITY_CHUNKS - 1) * chunk + last)


def bounded_case(case: Case) -> Case:
    """The case the causality check runs for ``case``: the same op, variant, gate, dtype, heads, head dims,
    options and packing, every sequence cut to at most :data:`CAUSALITY_CHUNKS` chunks (:func:`_bounded`).
    A case that short already is itself. The check's cost is then bounded whatever T the suite has (fla's
    own test shapes run T = 1000-2000), and its power is the kernel paths', which the cut case keeps."""
    if case.lens is None:
        T = _bounded(case.T, case.chunk_size)
        return case if T == case.T else case.replace(T=T)
    lens = tuple(_bounded(n, case.chunk_size) for n in case.lens)
    return case if lens == case.lens else case.replace(T=sum(lens), lens=lens)


def causality_cases(cases: list[Case]) -> list[Case]:
    """One case per (op, variant, gate kind) of a suite, so every kernel path (the fused g_gamma
    ones included) is checked, and one more per (op, variant, gate kind) of its packed cases (the
    varlen paths, and the isolation check); the first with K and V multiples of 128, so every leg
    runs it, and among packed cases preferably one of three or more sequences (one isolation run
    checks both directions); among equals the cheapest. Each is cut to a bounded length
    (:func:`bounded_case`). Serving cases (a state pool, decode chains: :mod:`harness.ops.serving`) are not
    chosen: their state tensors are slots of a pool, not one per sequence, and their prefill is the same kernel
    path as a plain case's."""
    def merit(case: Case) -> tuple[bool, bool, int]:
        cost = case.B * case.T * case.HV * case.K * case.V  # the recurrence's work, up to a constant
        return (not (case.K % 128 or case.V % 128), case.num_seqs >= 3 if case.lens is not None else True,
                -cost)

    chosen: dict[tuple, Case] = {}
    for case in map(bounded_case, (c for c in cases if not is_served(c))):
        key = (case.op, case.variant, case.gate and case.gate.kind, case.lens is not None)
        if key not in chosen or merit(case) > merit(chosen[key]):
            chosen[key] = case
    return list(chosen.values())


def causality_frame(rows: Iterable[dict]):
    """Causality rows (:class:`CausalityRow` as dicts) as a pandas DataFrame with every column, even when empty."""
    import pandas as pd

    return pd.DataFrame(list(rows), columns=[f.name for f in dataclasses.fields(CausalityRow)])
