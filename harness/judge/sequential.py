"""The sequential test over input draws, written once: while a gate has inconclusive comparisons short of the cap,
ask for the draws that decide them and judge again.

One draw leaves a comparison inconclusive when its ratio is past the margin and its blocks cannot tell the
excess from noise (:mod:`harness.core.noise`). The test then looks again at :data:`harness.core.noise.LOOKS`
draws (3, 8, 24), pooling every draw it has; a comparison its first draw decided keeps that verdict whatever the
later draws give (:func:`harness.judge.gate.apply_gate`).

:func:`sequential_gate` is the rule; the draws come through :class:`Evidence`, which the caller implements:
``parity all`` runs each leg on the draws it lacks and folds the rows into its result files
(:class:`harness.app.session.Run`); the pytest plugin runs the candidate on one case's draws and takes the
baseline's from its file (:func:`harness.app.gate_case`). Nothing here runs a leg."""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

import pandas as pd

from cases.case import Case
from harness.core.noise import LOOKS, next_look
from harness.core.policy import Policy
from harness.judge.gate import GateResult, apply_gate, undrawn_id


class Evidence(Protocol):
    """The rows a sequential gate judges, and the way to more of them."""

    def rows(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """(baseline rows, candidate rows) so far, every draw of every case."""

    def draw(self, cases: list[Case]) -> bool:
        """Make both legs' rows of these draws, each leg those it lacks; False when they cannot be had (the
        baseline's rows came from a file without them), and the comparisons stay inconclusive."""


def drawn_by(base: pd.DataFrame, candidate: pd.DataFrame, cases: Sequence[Case]) -> pd.DataFrame:
    """The baseline rows a candidate is gated on: the selected cases', and the extra draws the candidate ran too.
    With several candidates, the draws run to decide one candidate's comparison are not another's evidence, nor
    missing from its file (``parity gate`` on the files, which cannot know why a draw is there, fails them unless
    ``--allow-missing``)."""
    ids = {c.id for c in cases} | set(candidate["case_id"])
    return base[base["case_id"].isin(ids)]


def next_draws(inconclusive: pd.DataFrame, candidate: pd.DataFrame, cases: Sequence[Case], max_draws: int,
               say: Callable[[str], None] | None = None) -> list[Case]:
    """The draws that decide the inconclusive comparisons at their next look, at most ``max_draws`` per case,
    less those the candidate has. Only the undecided comparisons drive a case's draws: each case is drawn up to
    the next look of its own inconclusive comparisons, which ``say`` is told."""
    by_id = {c.replace(seed=0).id: c.replace(seed=0) for c in cases}
    drawn_ids = candidate["case_id"].map(undrawn_id)
    todo = []
    for base_id, undecided in inconclusive.groupby(inconclusive["case_id"].map(undrawn_id)):
        drawn = int(undecided["draws"].max())
        need = min(next_look(drawn) or drawn, max_draws)
        have = {int(d) for d in candidate.loc[drawn_ids == base_id, "draw"].dropna()}
        more = [by_id[base_id].replace(seed=s) for s in range(need) if s not in have]
        if more and say is not None:
            what = sorted({f"{t} {m}" for t, m in zip(undecided["tensor"], undecided["metric"])})
            say(f"gate: {base_id}: {', '.join(what)} undecided at {drawn} draw(s): {len(more)} more, to {need}")
        todo += more
    return todo


def sequential_gate(evidence: Evidence, cases: Sequence[Case], policy: Policy, options: dict | None = None,
                    max_draws: int = LOOKS[-1], redraw: bool = True,
                    say: Callable[[str], None] | None = None) -> GateResult:
    """The gate of ``evidence``'s rows over ``cases`` (:func:`harness.judge.gate.apply_gate` with ``options``),
    and while comparisons are inconclusive and ``redraw``: their next look's draws (:func:`next_draws`), until
    every comparison is decided, the cap is reached or the draws cannot be had."""
    options = options or {}

    def judge() -> GateResult:
        base, candidate = evidence.rows()
        return apply_gate(drawn_by(base, candidate, cases), candidate, policy, **options)

    result = judge()
    while redraw and not result.inconclusive.empty:
        todo = next_draws(result.inconclusive, evidence.rows()[1], cases, max_draws, say)
        if not todo or not evidence.draw(todo):  # at the cap, or the draws cannot be had: inconclusive stays
            break
        result = judge()
    return result
