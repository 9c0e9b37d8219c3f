"""What the gate re-derives of a result file by asking the leg itself: an ``unsupported`` row must be the leg's own
refusal of that case (docs/faults.md).

A refusal is the leg's answer (``Leg.supports``: its binding's limits, fla's, this project's kernels traced on the
case's shapes) before anything runs. A row edited from ``ok`` to ``unsupported`` would take its comparison out of
the gate, so ``parity gate`` asks the leg again, here, for every case its rows mark unsupported. The answer
stands for the rows only when they were made by the code that answers: the same commit of this harness and the
same versions of the leg's packages. Otherwise, or where the leg cannot be built here (fla on a TPU host, a
library that is not installed), the gate says it did not ask; it never guesses."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from harness.app.selection import case_from_id
from harness.core.provenance import git_commit
from harness.core.results import column_values, package_versions
from harness.core.status import Status
from harness.judge.gate import undrawn_id
from harness.legs.registry import leg_spec, make_leg
from harness.ops import get_op


def refusals_not_the_legs(rows: pd.DataFrame, leg_name: str, path: Path | str) -> tuple[list[str], str | None]:
    """``rows`` (one leg's result file at ``path``) re-asked: (one line per case the file marks unsupported that
    leg ``leg_name`` runs here, or None when there is nothing to ask) and a note of why the leg was not asked
    (None when it was)."""
    if not {"status", "case_id", "reason"} <= set(rows.columns):
        return [], None  # not a result file: the gate says what is wrong with it
    unsupported = rows[rows["status"] == Status.UNSUPPORTED]
    if unsupported.empty:
        return [], None
    why_not = _cannot_answer(rows, leg_name)
    if why_not:
        return [], f"the refusals in {path} were not re-asked of the {leg_name} leg: {why_not}"
    leg = make_leg(leg_name, **({"compile_targets": ()} if leg_spec(leg_name).role == "candidate" else {}))
    if package_versions(rows) != {k: str(v) for k, v in dict(leg.environment().versions).items()}:
        return [], (f"the refusals in {path} were not re-asked of the {leg_name} leg: its rows were made with other "
                    f"versions than the ones installed here")
    lines = []
    for case_id, reason in unsupported.drop_duplicates("case_id")[["case_id", "reason"]].itertuples(index=False):
        case = case_from_id(undrawn_id(case_id))
        try:
            answer = leg.supports(get_op(case.op), case)
        except Exception:  # noqa: BLE001 - a leg that cannot answer here does not refuse: the row is not judged
            continue
        if not answer:
            lines.append(f"{path}: {case_id} is unsupported there ({reason!r}), but the {leg_name} leg here runs "
                         f"it: the row was edited; run the case again")
    return lines, None


def _cannot_answer(rows: pd.DataFrame, leg_name: str) -> str | None:
    """Why leg ``leg_name`` here cannot speak for ``rows``' refusals, or None."""
    try:
        spec = leg_spec(leg_name)
    except ValueError:
        return "it is not registered here (--impl)"
    missing = spec.missing()
    if missing:
        return missing
    here = git_commit() or "unknown"
    made = column_values(rows, "git_commit")
    if made != [here]:
        return f"its rows come from commit {', '.join(made) or '(none)'}, this checkout is {here}"
    return None
