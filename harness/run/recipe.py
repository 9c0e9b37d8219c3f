"""A leg recipe: everything about one leg for one run, resolved once from the registry by the run
(:meth:`harness.app.session.Run.recipe`), and the one place a runner is built from it.

A recipe is a frozen, picklable record: the run's own process builds its runner from it, a worker process
rebuilds the same runner from it (:mod:`harness.app.workers`), and another stack's process is given it as a
``parity run`` command line (:meth:`LegRecipe.command_line`: the draws a gate needs from rows made elsewhere, each
version of a bisection). Nothing else turns a leg's settings back into a command line.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from harness.legs.registry import LegSpec, implementations, leg_spec, make_leg, register_implementation
from harness.legs.tpu import GRIDS
from harness.run.baseline_cache import for_leg
from harness.run.reference_cache import ReferenceCache
from harness.run.runner import Runner

TASKS = ("run", "causality", "compile")
"""What a case of the recipe gives: its result rows (run_case), its causality rows (harness.probes.causality), or
its compile rows for real TPUs (harness.probes.compile_cases)."""

CANDIDATE_CASE_TIMEOUT = 3600.0
"""An outside implementation's case time limit (seconds), when ``--case-timeout`` does not set one: about ten times
an interpret-mode case of the production suite here (this project's TPU leg, per program: 1813 s for its 5
cases, reports/production)."""

_FLAGS = {"method": "--ref-method", "compute_dtype": "--ref-dtype", "dot_precision": "--dot-precision",
          "compile_targets": "--tpu-targets", "batched_grid": "--grid"}
"""Each leg option's ``parity run`` flag (harness.parser): what :meth:`LegRecipe.command_line` writes."""


def _flag_value(value) -> str:
    """An option's value as its flag takes it: targets joined by commas, a grid by its name (harness.legs.tpu.GRIDS:
    ``batched`` for True, ``per-program`` for False)."""
    if isinstance(value, bool):
        return GRIDS[0] if value else GRIDS[1]
    return ",".join(value) if isinstance(value, tuple) else str(value)


def case_timeout(leg: str, given: float | None) -> float | None:
    """The time limit of one case of ``leg`` in seconds (0: none), or None when its cases may run in the
    command's own process: ``given`` (``--case-timeout``), else :data:`CANDIDATE_CASE_TIMEOUT` for an outside
    implementation (a leg registered from ``--impl`` or an entry point, whose library this project does not
    control), else None (this project's legs)."""
    if given is not None:
        return given
    return CANDIDATE_CASE_TIMEOUT if leg in implementations() else None


@dataclasses.dataclass(frozen=True)
class LegRecipe:
    """One leg as one run uses it."""

    name: str  # the leg (harness.legs.registry)
    options: tuple[tuple[str, Any], ...] = ()  # make_leg's keywords, sorted by name
    suite: str = ""  # the rows' suite column
    reference_cache: Path | None = None  # the goldens' cache directory (None: in memory)
    cache_dir: Path | None = None  # the caches' root: the leg's output cache and its own under it (None: none)
    leg_cache: bool = True  # use the leg's output cache, where it has one
    read_cache: bool = True  # read that cache (False: recompute, rewrite the entries)
    timeout: float | None = None  # seconds a case may run, in a worker of its own (0: no limit); None: in process
    task: str = "run"  # the mode: one of TASKS
    targets: tuple[str, ...] = ()  # the real TPUs a compile task compiles each case for
    implementations: tuple[tuple[str, str], ...] = ()  # --impl and entry-point registrations a worker repeats
    impl: tuple[str, ...] = ()  # the --impl NAME=module:object texts another stack's process repeats

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; one of {', '.join(TASKS)}")
        object.__setattr__(self, "options", tuple(sorted(dict(self.options).items())))

    @classmethod
    def resolve(cls, name: str, options: dict, case_timeout_s: float | None = None, **fields) -> "LegRecipe":
        """Leg ``name``'s recipe: its registrations and its case time limit read once from the registry."""
        return cls(name=name, options=tuple(options.items()), timeout=case_timeout(name, case_timeout_s),
                   implementations=tuple(sorted(implementations().items())), **fields)

    @property
    def spec(self) -> LegSpec:
        return leg_spec(self.name)

    @property
    def keywords(self) -> dict:
        return dict(self.options)

    def runner(self, reference_cache: ReferenceCache | None = None) -> Runner:
        """The one place a :class:`harness.run.runner.Runner` is built: the leg made with the recipe's options,
        over ``reference_cache`` (default: one at the recipe's directory), its rows' suite column, and the leg's
        output cache where the recipe uses one."""
        made = make_leg(self.name, **self.keywords)
        made.keep_caches_under(self.cache_dir)
        cache = for_leg(made, read=self.read_cache, cache_dir=self.cache_dir) if self.leg_cache else None
        return Runner(made, reference_cache or ReferenceCache(self.reference_cache), suite=self.suite,
                      leg_cache=cache)

    def in_worker(self) -> Runner:
        """The runner a worker process rebuilds: the parent's registrations repeated first."""
        for name, target in self.implementations:
            register_implementation(name, target)
        return self.runner()

    def command_line(self, python: str, case_ids, out: Path, jobs: int = 1, resume: bool = False) -> list[str]:
        """The ``parity run`` command that runs this recipe's leg over ``case_ids`` with ``python`` (another
        stack's interpreter, this project on its path) into ``out``: the one place a recipe becomes a command
        line. Every option is written but an unset one (None: that process's own default)."""
        flags = []
        for key, value in self.options:
            if value is not None:
                flags += [_FLAGS[key], _flag_value(value)]
        if self.timeout is not None and self.timeout != case_timeout(self.name, None):
            flags += ["--case-timeout", f"{self.timeout:g}"]
        return [python, "-m", "harness.cli", "run", "--backend", self.name, "--out", str(out),
                *(["--resume"] if resume else []), "--no-progress", "--jobs", str(jobs),
                *[a for text in self.impl for a in ("--impl", text)], *flags,
                *[a for case_id in case_ids for a in ("--case", case_id)]]
