"""Causality check: the future must not leak into the past, on any leg, for any op.

For a case and a cut position ``t0`` the leg runs twice: on the case's inputs,
and on inputs whose time-indexed forward tensors (every input of shape
[B, T, ...] that is not an upstream gradient: q, k, v, g, beta, ...) are
redrawn at positions ``t > t0``. The upstream gradients (``do``, ``dht``) stay
the same. Then ``o`` and ``dq`` at positions ``t <= t0`` must not change.

A chunked kernel masks future positions with exact zeros, so the result is
normally bit-exact; that is what is required (``max_abs_diff == 0``). Where a
kernel's reduction order makes bit-exactness impossible, the relative change
must stay below ``CAUSALITY_REL_BOUND`` (1e-6), three orders under the
smallest ε of any case dtype. A NaN in either run fails the check.

This catches the leak class tolerances miss: fla's "future gates of a chunk
leak into earlier outputs" bug moves o by far less than ε on random inputs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from cases.case import Case
from cases.inputs import Inputs, inputs_sha256, make_inputs

from .legs.base import Leg
from .ops.base import OpDescriptor
from .reference_cache import ReferenceCache
from .runner import Refusal, Runner
from .status import Status

CAUSALITY_REL_BOUND = 1e-6
CHECKED = ("o", "dq")


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


def default_t0(case: Case) -> int:
    """Cut inside a chunk, past the first one when there are several: both the
    intra-chunk mask and the inter-chunk state pass are exercised."""
    C = case.chunk_size
    return min(case.T - 2, C + C // 2 - 1) if case.T > C else case.T // 2 - 1


def perturb_future(op: OpDescriptor, case: Case, inputs: Inputs, t0: int) -> Inputs:
    """Redraw every time-indexed forward input ([B,T,H,...]) at positions > t0 (same laws, other seed)."""
    cotangent_names = set(op.cotangents.values())
    alt = make_inputs(case.replace(seed=case.seed + 7919), op.inputs(case))
    arrays = dict(inputs.arrays)
    for name, a in inputs.arrays.items():
        if name in cotangent_names or a.ndim < 3 or a.shape[:3] != (case.B, case.T, case.H):
            continue
        b = a.copy()
        b[:, t0 + 1:] = alt[name][:, t0 + 1:]
        arrays[name] = b
    return Inputs(arrays, inputs_sha256(arrays))


def check_case(leg: Leg, case: Case, t0: int | None = None, runner: Runner | None = None) -> list[CausalityRow]:
    """Run the case twice through the runner's own steps (validation, inputs, supports, preflight,
    run) and compare ``o`` and ``dq`` up to ``t0``."""
    runner = runner or Runner(leg, ReferenceCache(None))
    t0 = default_t0(case) if t0 is None else t0
    mode = runner.provenance["mode"]

    def rows(status, reason, sha="", wall=0.0):
        return [CausalityRow(case.id, leg.name, n, t0, np.nan, np.nan, False, status, reason, mode, sha, wall)
                for n in CHECKED]

    start = time.perf_counter()
    try:
        op, inputs = runner.prepare(case)
        base = runner.execute(op, case, inputs)[0].tensors
        moved = runner.execute(op, case, perturb_future(op, case, inputs, t0))[0].tensors
    except Refusal as r:
        return rows(r.status, r.reason, r.columns.get("input_sha256", ""))
    wall = time.perf_counter() - start
    out = []
    for name in CHECKED:
        if base.get(name) is None or moved.get(name) is None:
            out.append(CausalityRow(case.id, leg.name, name, t0, np.nan, np.nan, False, Status.UNSUPPORTED,
                                    f"the {leg.name} leg does not return {name}", mode, inputs.sha256, wall))
            continue
        y0 = np.asarray(base[name], dtype=np.float64)[:, : t0 + 1]
        y1 = np.asarray(moved[name], dtype=np.float64)[:, : t0 + 1]
        finite = bool(np.isfinite(y0).all() and np.isfinite(y1).all())
        diff = np.abs(y1 - y0)
        max_abs = float(diff.max()) if finite else np.inf
        norm = float(np.linalg.norm(y0))
        rel = (float(np.linalg.norm(y1 - y0)) / norm if norm else (0.0 if max_abs == 0 else np.inf)) if finite \
            else np.inf
        exact = finite and max_abs == 0.0
        if not finite:
            status, why = Status.LEAK, "NaN/Inf in a causality run"
        elif exact or rel <= CAUSALITY_REL_BOUND:
            status, why = Status.OK, "" if exact else f"not bit-exact: rel change {rel:.2e} <= {CAUSALITY_REL_BOUND:g}"
        else:
            status, why = Status.LEAK, (f"{name}[t<={t0}] changed when inputs after t0 changed: max |diff| "
                                   f"{max_abs:.3g}, rel {rel:.3g} > {CAUSALITY_REL_BOUND:g}")
        out.append(CausalityRow(case.id, leg.name, name, t0, max_abs, rel, exact, status, why, mode,
                                inputs.sha256, wall))
    return out


def causality_cases(cases: list[Case]) -> list[Case]:
    """One case per (op, variant, gate kind) of a suite, so every kernel path (the fused g_gamma
    ones included) is checked; the first with K and V multiples of 128, so every leg runs it."""
    chosen: dict[tuple[str, str, str], Case] = {}
    for case in cases:
        key = (case.op, case.variant, case.gate and case.gate.kind)
        if key not in chosen or (chosen[key].K % 128 and not case.K % 128):
            chosen[key] = case
    return list(chosen.values())


def run_causality(leg: Leg, cases: list[Case], progress: bool = True):
    """Rows (a pandas DataFrame) for every case on one leg."""
    import dataclasses

    import pandas as pd

    rows = []
    iterator = cases
    if progress:
        from tqdm import tqdm

        iterator = tqdm(cases, desc=f"{leg.name} causality", unit="case", dynamic_ncols=True, disable=None)
    runner = Runner(leg, ReferenceCache(None))
    for case in iterator:
        rows.extend(dataclasses.asdict(r) for r in check_case(leg, case, runner=runner))
    return pd.DataFrame(rows, columns=[f.name for f in dataclasses.fields(CausalityRow)])
