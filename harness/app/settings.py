"""A run's settings, as frozen records built once per command by a front end (the CLI from its arguments, the
pytest plugin from its options) and read by every stage; nothing below the front reads a command line.

- :class:`LegOptions`: what each leg is built with, by its role (the reference's method and dtype, the
  baseline's dot precision, a candidate's real-TPU compile targets);
- :class:`RunSettings`: which cases, where the rows go and under which rules (tag, force, resume), how many
  cores, which caches and where they are, the legs' options, whether a progress bar shows, and what ``parity all``
  adds: the baseline's rows made elsewhere (and the Python that makes their missing draws), the further
  candidates, whether each leg's causality is checked;
- :class:`GateSettings`: the policy (loaded once), the legs the gate compares, ``--allow-missing``,
  ``--allow-partial``, which rows a file gate judges, the sequential test's cap on draws, where a JUnit report
  goes and the step summary the report is appended to.

The environment's settings (``PARITY_CACHE_DIR``, ``PARITY_TPU_GRID``, ``PARITY_BATCHED_GRID``,
``GITHUB_STEP_SUMMARY``) are read by the front into these records (:func:`harness.core.cache_dir.default_cache_dir`
and :func:`environment_grids` are the rules; the front hands them ``os.environ``), never by a stage.

Each record checks itself when made: a bad value is a ValueError with one line, which each front end turns into
its usage error (exit 2 on the CLI)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from harness.app.selection import Selection
from harness.compile.tpu_compile import LEG_DEFAULT_TARGETS, parse_targets
from harness.core.noise import LOOKS
from harness.core.policy import Policy, default_policy
from harness.legs.registry import default_leg, leg_spec
from harness.legs.tpu import GRIDS

DUMP_ROOM = 64 * 2**20
"""The smallest file size limit (``ulimit -f``) a TPU compile starts under, in bytes: libtpu writes each kernel's
Mosaic dump, from which the compile verdicts are read (the largest seen here: 220 KB), and aborts the process with
some 40 lines of C++ (``Check failed ... File too large``) when one does not fit."""

REF_METHODS = ("recurrent", "chunk")
REF_DTYPES = ("float64", "float32")
DOT_PRECISIONS = ("tf32", "tf32x3", "ieee")
GRID_ENVIRONMENT = {"pallas_grid": "PARITY_TPU_GRID", "triton_grid": "PARITY_BATCHED_GRID"}
"""The environment variables the front reads into :class:`LegOptions`' grids (``--grid`` overrides both)."""
_OFF = ("0", "false", "no", "off")  # PARITY_BATCHED_GRID's older values for per-program


def environment_grids(environ) -> dict:
    """:class:`LegOptions`' grids from ``environ`` (the front's ``os.environ``): ``PARITY_TPU_GRID`` for the emulated
    TPU leg and ``PARITY_BATCHED_GRID`` for the emulated GPU leg, each ``batched`` or ``per-program`` (the latter
    also ``0``/``false``/``no``/``off``, its older spelling); unset or empty: batched. Anything else is a ValueError
    that names the variable."""
    grids = {}
    for field, name in GRID_ENVIRONMENT.items():
        value = environ.get(name, "").strip().lower() or GRIDS[0]
        value = GRIDS[1] if field == "triton_grid" and value in _OFF else value
        if value not in GRIDS:
            raise ValueError(f"{name}={environ.get(name)!r}: must be one of {', '.join(GRIDS)}")
        grids[field] = value
    return grids


def check_file_size_limit(targets, limit: int | None = None) -> None:
    """A ValueError (one line) when TPU ``targets`` are to be compiled under a file size limit (``limit`` bytes,
    default this process's ``RLIMIT_FSIZE``) too small for libtpu's dumps (:data:`DUMP_ROOM`)."""
    if not targets:
        return
    import resource

    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0] if limit is None else limit
    if soft != resource.RLIM_INFINITY and soft < DUMP_ROOM:
        raise ValueError(f"the file size limit (ulimit -f) is {soft // 1024} KiB: libtpu aborts the process when a "
                         f"file it writes while compiling for {', '.join(targets)} does not fit; raise it to at least "
                         f"{DUMP_ROOM >> 20} MiB (ulimit -f {DUMP_ROOM >> 10}) or to unlimited")


@dataclasses.dataclass(frozen=True)
class LegOptions:
    """What each leg is built with, by its role (:func:`harness.legs.make_leg`'s keywords)."""

    ref_method: str = "recurrent"  # the reference leg's formulation, recomputed against the chunked golden
    ref_dtype: str = "float64"  # the reference leg's compute dtype
    dot_precision: str | None = None  # the baseline's TRITON_F32_DEFAULT (None: the environment's, else tf32)
    compile_targets: tuple[str, ...] = LEG_DEFAULT_TARGETS  # real TPUs an emulated candidate compiles each case for
    pallas_grid: str = GRIDS[0]  # an emulated candidate's grid walk: batched or per-program (harness.legs.tpu.GRIDS)
    triton_grid: str = GRIDS[0]  # the emulated baseline's: batched (harness/emulation/batched_grid.py) or per-program

    def __post_init__(self):
        for name, value, allowed in (("ref_method", self.ref_method, REF_METHODS),
                                     ("ref_dtype", self.ref_dtype, REF_DTYPES),
                                     ("dot_precision", self.dot_precision, (None, *DOT_PRECISIONS)),
                                     ("pallas_grid", self.pallas_grid, GRIDS),
                                     ("triton_grid", self.triton_grid, GRIDS)):
            if value not in allowed:
                raise ValueError(f"{name}={value!r} must be one of {', '.join(map(str, allowed))}")
        parse_targets(",".join(self.compile_targets), LEG_DEFAULT_TARGETS)  # an unknown target: a ValueError

    @classmethod
    def parse(cls, tpu_targets: str | None = None, **options) -> "LegOptions":
        """The options with the targets as a command line gives them (``"v5e,v6e"``; None: the default)."""
        targets = parse_targets(tpu_targets, LEG_DEFAULT_TARGETS)
        check_file_size_limit(targets)
        return cls(compile_targets=targets, **options)

    def for_leg(self, name: str) -> dict:
        """The keywords ``name``'s leg is built with, by its role."""
        role = leg_spec(name).role
        if role == "reference":
            return {"method": self.ref_method, "compute_dtype": self.ref_dtype}
        if role == "baseline":
            return {"dot_precision": self.dot_precision, "batched_grid": self.triton_grid == GRIDS[0]}
        return {"compile_targets": self.compile_targets, "batched_grid": self.pallas_grid == GRIDS[0]}


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """How one command runs its legs."""

    selection: Selection = Selection()
    out: Path = Path("reports") / "runs"  # the result files' folder
    tag: str | None = None  # inserted in result file names: gpu.<tag>.csv
    force: bool = False  # replace another suite's result file, or discard an interrupted run's partial file
    resume: bool = False  # continue an interrupted run from its partial file
    jobs: int = 1  # cores: each leg runs jobs // (cores one of its cases keeps busy) cases at once
    reference_cache: bool = True  # read and write the on-disk reference cache
    read_leg_cache: bool = True  # serve legs' outputs from their caches (False: recompute, rewrite the entries)
    legs: LegOptions = LegOptions()
    progress: bool = True  # a progress bar per leg (shown only on a terminal)
    case_timeout: float | None = None  # seconds a case may run, in a worker of its own (0: no limit); None: the legs'
    cache_dir: Path | None = None  # the caches' root (None: none; the front gives harness.core.cache_dir's)
    # parity all
    baseline_rows: tuple[Path, ...] = ()  # the baseline's rows made elsewhere: the baseline is not run here
    baseline_python: str | None = None  # the Python of that stack, which makes the draws those rows lack
    candidates: tuple[str, ...] = ()  # further candidate legs, each gated against the baseline
    causality: bool = True  # each leg's causality and isolation check

    def __post_init__(self):
        object.__setattr__(self, "out", Path(self.out))
        object.__setattr__(self, "baseline_rows", tuple(Path(p) for p in self.baseline_rows))
        if self.baseline_python and not self.baseline_rows:
            raise ValueError("--baseline-python makes the baseline's missing draws for --baseline-rows: give the "
                             "baseline's rows too")
        for name in self.candidates:
            if leg_spec(name).role != "candidate":
                raise ValueError(f"--candidate {name} is the {leg_spec(name).role} leg, not a candidate")
        if not isinstance(self.jobs, int) or self.jobs < 1:
            raise ValueError(f"jobs={self.jobs!r} must be a whole number of cores, at least 1 (1: no workers)")
        if self.case_timeout is not None and not self.case_timeout >= 0:
            raise ValueError(f"case_timeout={self.case_timeout!r} must be a number of seconds, at least 0 (0: none)")


def parse_case_timeout(text: str | None) -> float | None:
    """``--case-timeout SECONDS``: a number of seconds, at least 0 (0: no limit); None when not given; anything
    else is a ValueError that says the form."""
    if text is None:
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(f"--case-timeout {text!r} must be a number of seconds, at least 0 (0: no limit)")
    return seconds


@dataclasses.dataclass(frozen=True)
class GateSettings:
    """How the gate judges: ε_candidate ≤ ε_baseline under :attr:`policy`."""

    policy: Policy = dataclasses.field(default_factory=default_policy)  # loaded once, by the front
    baseline_leg: str = dataclasses.field(default_factory=lambda: default_leg("baseline"))
    candidate_leg: str = dataclasses.field(default_factory=lambda: default_leg("candidate"))
    allow_missing: bool = False  # a (case, tensor) in one file only is counted and shown, not failed
    max_draws: int = LOOKS[-1]  # the sequential test's cap on input draws per case
    junit: Path | None = None  # also write the verdicts as JUnit XML here (checked by the front before any work)
    force: bool = False  # replace a JUnit file the gate did not write
    allow_partial: bool = False  # parity gate: judge an interrupted run's partial file (never a pass)
    cases: Selection | None = None  # parity gate: judge only these cases' rows and their draws (None: every case)
    ops: tuple[str, ...] = ()  # parity gate: judge only these ops' rows (empty: every op)
    step_summary: Path | None = None  # $GITHUB_STEP_SUMMARY: parity.md is appended there too (checked by the front)

    def __post_init__(self):
        if not isinstance(self.max_draws, int) or self.max_draws < 1:
            raise ValueError(f"--max-draws {self.max_draws}: give at least 1 (1 draws nothing more)")

    def row_filter(self):
        """Which rows of a file the gate judges (:attr:`cases`, :attr:`ops`): a function of the rows, or None for
        every row. The cases are read here, once (a bad selection is a ValueError)."""
        if self.cases is None and not self.ops:
            return None
        from harness.judge.gate import of_cases

        ids = None if self.cases is None else {c.id for c in self.cases.cases()}
        ops = set(self.ops)

        def select(rows):
            keep = of_cases(rows, ids) if ids is not None else rows["case_id"].notna() | rows["case_id"].isna()
            if ops:
                keep &= rows["op"].isin(ops)
            return rows[keep].reset_index(drop=True)
        return select

    def options(self, candidate_leg: str | None = None) -> dict:
        """:func:`harness.judge.gate.apply_gate`'s keywords, for this candidate or another (``--candidate``)."""
        return {"allow_missing": self.allow_missing, "baseline_leg": self.baseline_leg,
                "candidate_leg": candidate_leg or self.candidate_leg}
