"""Which cases a run covers, and which file holds a leg's rows of them.

- :class:`Selection`: comma-joined suites, or cases by id and from case files (in order, each once), then ``--op``
  (comma-joined ops, or the option repeated), input draws and a shard. Case ids and case files are validated
  against the op registry here: the case layer (``cases/``) imports no op, this layer passes
  ``harness.ops.get_op`` in.
- :meth:`Selection.result_name` (:func:`harness.run.result_file.result_name`): a run of part of a suite names its
  part, so it never replaces the suite's own result file; :func:`result_in` finds a leg's file in a folder.

Every error is a ValueError with one line; each front end turns it into its own usage error.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

from cases import case_file, suites
from cases.case import Case

from harness.core.results import unfinished
from harness.ops import get_op
from harness.run.result_file import result_name
from harness.run.runner import parse_shard, shard


def case_from_id(text: str) -> Case:
    """The case an id names, validated by its op (ValueError, one line, otherwise)."""
    return Case.from_id(text, ops=get_op)


def find_case(case_id: str) -> Case:
    """The suite case an id names (at any draw), else the validated case the id describes."""
    return suites.find_case(case_id, ops=get_op)


def load_cases(path) -> list[Case]:
    """The validated cases of a case file (:func:`cases.case_file.load_cases`)."""
    return case_file.load_cases(path, ops=get_op)


@dataclasses.dataclass(frozen=True)
class Selection:
    """The cases a run covers. ``suite`` may join several suites with commas, and each of ``ops`` several ops;
    ``case_ids`` and ``cases_files``, when given, replace the suite."""

    suite: str = "smoke"
    case_ids: tuple[str, ...] = ()
    cases_files: tuple[str, ...] = ()
    ops: tuple[str, ...] = ()
    draws: int = 1
    shard: str | None = None

    def __post_init__(self):  # --op a,b is --op a --op b
        object.__setattr__(self, "ops", tuple(n.strip() for text in self.ops for n in text.split(",") if n.strip()))

    @property
    def by_id(self) -> bool:
        """Whether the cases are chosen one by one rather than as a suite."""
        return bool(self.case_ids or self.cases_files)

    @property
    def suite_label(self) -> str:
        """The rows' ``suite`` column: empty for cases chosen one by one; a suite over several input draws
        says how many (``smoke@draws=5``)."""
        if self.by_id:
            return ""
        return self.suite + (f"@draws={self.draws}" if self.draws > 1 else "")

    def cases(self) -> list[Case]:
        """The selected cases, in order; a ValueError (one line) for a bad id, file, suite, shard or an
        empty selection."""
        if self.by_id:
            chosen = [find_case(c) for c in self.case_ids] + [c for f in self.cases_files for c in load_cases(f)]
            first: dict[str, Case] = {}
            for c in chosen:
                first.setdefault(c.id, c)
            cases = list(first.values())
        else:
            names = [n.strip() for n in self.suite.split(",") if n.strip()]
            cases = [c for name in names for c in suites.get_suite(name)]
        if self.ops:
            for name in self.ops:
                get_op(name)  # an unknown op is an error, not a silently smaller selection
            cases = [c for c in cases if c.op in self.ops]
        cases = suites.with_draws(cases, self.draws)
        if self.shard:
            cases = shard(cases, *parse_shard(self.shard))
        for case in cases:
            check_memory(case)
        if not cases:
            what = "the cases by id and file" if self.by_id else f"suite {self.suite!r}"
            raise ValueError(f"the selection is empty: {what} with ops {list(self.ops) or 'all'}"
                             f"{f', shard {self.shard}' if self.shard else ''} selects no case")
        return cases

    def result_name(self, leg: str, tag: str | None = None, cases: list[Case] | None = None) -> str:
        """The result file's name for ``leg``'s rows over this selection (``cases``: its cases, when the caller
        has them already, so case files are not read again)."""
        ids = [c.id for c in (self.cases() if cases is None else cases)] if self.by_id else ()
        return result_name(leg, tag=tag, case_ids=ids, ops=self.ops, draws=self.draws, shard=self.shard)


def result_in(path, leg: str) -> Path:
    """``path`` itself, or for a directory the one result file of ``leg`` in it (``<leg>.csv``, or
    ``<leg>.<tag, selection, draws, shard>.csv`` as :meth:`Selection.result_name` names them; never a partial
    file). A directory with none or several is a ValueError that lists what it has."""
    path = Path(path)
    if not path.is_dir():
        return path
    found = sorted(p for p in path.glob(f"{leg}*.csv") if (p.name == f"{leg}.csv" or p.name.startswith(f"{leg}."))
                   and not unfinished(p))
    if len(found) != 1:
        what = ", ".join(p.name for p in found) if found else "none"
        raise ValueError(f"{path} is a directory: it must hold exactly one result file of the {leg} leg, it holds "
                         f"{what}; name the file")
    return found[0]


def input_bytes(case: Case) -> int | None:
    """The bytes of a case's inputs as every leg first holds them (each drawn in float64, 8 bytes an element): a
    lower bound of what running it needs. None for a case its op cannot lay out (the runner makes its error rows)."""
    try:
        specs = get_op(case.op).inputs(case)
        return 8 * sum(math.prod(int(n) for n in spec.shape(case)) for spec in specs)
    except Exception:  # noqa: BLE001 - an invalid case is the runner's to report, row by row
        return None


def physical_memory() -> int | None:
    """This machine's physical memory in bytes (None where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(case: Case, memory: int | None = None) -> None:
    """A ValueError (one line) for a case whose inputs alone need more memory than the machine has (``memory``
    bytes, default :func:`physical_memory`): refused before anything is allocated."""
    memory = physical_memory() if memory is None else memory
    need = input_bytes(case)
    if memory and need is not None and need > memory:
        raise ValueError(f"case {case.id} needs at least {need / 2**30:,.1f} GiB for its inputs alone (drawn in "
                         f"float64), more than this machine's {memory / 2**30:,.1f} GiB: refused before anything "
                         f"is allocated; make it smaller")

