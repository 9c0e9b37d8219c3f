"""What ``parity ptx`` (:func:`harness.emulation.ptx.sweep`) asks of the leg whose launches it records, answered
here because the emulation layer knows no leg: what its outputs on the selected cases depend on (the record's
key), and the command that runs it over them (its recipe's, :meth:`harness.run.recipe.LegRecipe.command_line`)."""

from __future__ import annotations

import sys
from pathlib import Path

from harness.app.selection import Selection
from harness.app.settings import LegOptions
from harness.run.recipe import LegRecipe


def _cases(suite: str, case_ids) -> list:
    return Selection(suite="" if case_ids else suite, case_ids=tuple(case_ids)).cases()


def leg_inputs(leg: str, suite: str, case_ids) -> dict:
    """The selected cases and what the leg's outputs on them depend on
    (:func:`harness.run.baseline_cache.leg_inputs`); ValueError for a bad selection."""
    from harness.run.baseline_cache import leg_inputs as inputs

    return inputs(leg, _cases(suite, case_ids))


def capture_command(leg: str, suite: str, case_ids, out: Path) -> list[str]:
    """``parity run`` of the leg with the run's default options over the selected cases, one case at a time in one
    process (``--jobs 1``: every launch in the process that records them), into ``out``."""
    recipe = LegRecipe.resolve(leg, LegOptions().for_leg(leg))
    return recipe.command_line(sys.executable, [c.id for c in _cases(suite, case_ids)], out, jobs=1)
