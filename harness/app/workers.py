"""Cases across worker processes: ``parity run|all|causality|calibrate|compile --jobs N``.

An emulated leg spends nearly all of a case tracing and compiling it (the Triton interpreter, Pallas interpret
mode). ``--jobs N`` is a number of cores, and every leg runs N cases at once, in N processes. The emulated TPU
leg's case runs its real-TPU compile in a thread beside its run, yet keeps only about 1.4 cores busy, most of it
one thread tracing: on 2 cores two of its workers give its smoke cases in 25% less time than one
(reports/bench/2026-11-29-tpu-workers). Rows stay the only interface:

- the parent walks the cases in order and settles where it stands every case that needs no leg run: an invalid
  or unsupported case, or one whose every run the leg's cache serves (a :class:`harness.run.runner.Runner` built
  with ``run_leg=False`` raises :class:`harness.run.runner.NotServed` for the others);
- the others go to a pool of spawned processes. Each rebuilds the runner from the leg's recipe
  (:class:`harness.run.recipe.LegRecipe`, replaying the ``--impl`` registrations), runs the whole case through it
  with the parent's provenance, and sends back the rows and its leg cache's hits and misses;
- the parent hands the rows on in case order, so a result file reads the same at any N.

A case goes, where it can, to the worker that held it in an earlier pass of the same command (:data:`CHOICE`):
the causality pass after a leg's then reuses the programs that worker compiled for the case's run.

``parity compile`` sends every case (its validation, inputs and libtpu compiles for each target) to the pool: a
compile keeps one core busy whatever the leg, and there is no cache to settle anything in the parent.

The pool starts on the first case that needs a run (a re-run that the caches serve whole starts no process) and
serves every leg of one command. Each worker holds one case at a time, so **a case's death is its own**: a worker
that exits, is killed by a signal (a segfault or an abort in a library's C++, the kernel's out-of-memory killer) or
runs past the case's time limit is stopped, its case becomes error rows that say how it ended (the exit code or
the signal, the last lines of its stderr), a fresh worker takes the next case, and the other workers' cases go on.

An outside implementation (``--impl``, an entry point) runs each case in a worker even at ``--jobs 1``, with a
time limit (:data:`harness.run.recipe.CANDIDATE_CASE_TIMEOUT`); ``--case-timeout`` sets the limit for every leg of a command, and
with it every leg's cases run in workers. A command whose cases were lost so exits 4, not 1
(:data:`LOST`; docs/faults.md).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import copy
import dataclasses
import itertools
import multiprocessing
import multiprocessing.connection
import os
import signal
import tempfile
import threading
import time
from typing import Any, Callable, Iterable

from cases.case import Case

from harness.probes.causality import check_case, default_t0, refused_rows
from harness.probes.compile_cases import case_rows, error_rows as compile_error_rows
from harness.run.recipe import CANDIDATE_CASE_TIMEOUT, TASKS, LegRecipe  # noqa: F401  (the pool's vocabulary)
from harness.run.runner import NotServed, Runner
from harness.core.memory import GIB_PER_JOB
from harness.core.status import Status

STOP = threading.Event()
"""Set by the command line's Ctrl-C and SIGTERM handler (:func:`harness.cli.main`): the walk of the cases stops
before its next case even when the handler's KeyboardInterrupt was swallowed where it landed."""


def _stop_if_asked() -> None:
    if STOP.is_set():
        raise KeyboardInterrupt


def default_jobs(environ, cpus: int | None = None, memory_gib: float | None = None) -> int:
    """``PARITY_JOBS`` when set, else one per CPU this process may use (``cpus``), at most one per
    :data:`GIB_PER_JOB` of physical memory (``memory_gib``), at least 1."""
    if environ.get("PARITY_JOBS"):
        return parse_jobs(environ["PARITY_JOBS"], "PARITY_JOBS")
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if memory_gib is None:
        try:
            memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
        except (ValueError, OSError, AttributeError):  # no sysconf: the CPUs decide
            memory_gib = cpus * GIB_PER_JOB
    return max(1, min(cpus, int(memory_gib // GIB_PER_JOB)))


def parse_jobs(text: str, what: str = "--jobs") -> int:
    """A positive count of worker processes; anything else is a ValueError that says the form."""
    try:
        jobs = int(text)
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise ValueError(f"{what} {text!r} must be a whole number of cores, at least 1 (1: no workers)")
    return jobs


CHOICE = 2
"""Waiting cases a free worker may choose among, per case run at once (:meth:`Workers._run_pooled`): enough that a
case usually reaches the worker that ran it in an earlier pass (the causality pass after the leg's: there its
programs are compiled, elsewhere they are traced and compiled again), few enough that rows come out soon."""

_JOB_NUMBERS = itertools.count()  # in the parent: one key per walk of a leg, never reused (an id() can be)
_RUNNERS: dict[int, Runner] = {}  # in each worker: the runner of every walk it has served


@dataclasses.dataclass(frozen=True)
class _Walk:
    """What a worker is sent with each case: the leg's recipe, the parent's provenance (so every row of a file
    carries one) and the key its runner is kept under there."""

    key: int
    recipe: LegRecipe
    provenance: tuple[tuple[str, Any], ...]


def _runner(walk: _Walk) -> Runner:
    runner = _RUNNERS.get(walk.key)
    if runner is None:
        runner = walk.recipe.in_worker()
        runner.provenance = dict(walk.provenance)
        _RUNNERS[walk.key] = runner
    return runner


def settle(runner: Runner, case: Case, task: str, targets: tuple[str, ...] = ()) -> list[dict]:
    """The case's rows through ``runner``: its result rows, its causality rows as dicts, or its compile rows."""
    if task == "causality":
        return [dataclasses.asdict(r) for r in check_case(runner, case)]
    if task == "compile":
        return case_rows(case, targets, runner)
    return runner.run_case(case)


def _work(walk: _Walk, case: Case) -> tuple[list[dict], int, int]:
    """In a worker: (the case's rows, the leg cache's hits and misses on it)."""
    runner = _runner(walk)
    cache = runner.leg_cache
    before = (cache.hits, cache.misses) if cache is not None else (0, 0)
    rows = settle(runner, case, walk.recipe.task, walk.recipe.targets)
    after = (cache.hits, cache.misses) if cache is not None else (0, 0)
    return rows, after[0] - before[0], after[1] - before[1]


STDERR_LINES = (3, 5)
"""How much of a lost case's stderr its error rows quote: its first lines (what the case printed before it ended)
and its last (how it ended; a crash handler, such as libtpu's, writes a dozen lines of its own there)."""


class CaseLost(Exception):
    """A case whose worker process ended without its rows (an exit, a signal, a time limit); the message says how."""


class _WorkerFailed(Exception):
    """A case that raised in its worker outside the runner's own handling (the message: the exception, in a line)."""


def _serve(conn, log_path: str) -> None:
    """A worker's life: take (job, case), send back ("rows", result) or ("failed", text), until told None. Its
    stderr (fd 2: Python's and every library's) goes to ``log_path``, emptied before each case, so that the
    parent can quote the last lines of a case that killed it. Ctrl-C is the parent's to handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    log = open(log_path, "wb", buffering=0)
    os.dup2(log.fileno(), 2)
    while (message := conn.recv()) is not None:
        os.ftruncate(2, 0)
        os.lseek(2, 0, os.SEEK_SET)
        try:
            answer = ("rows", _work(*message))
        except Exception as exc:  # noqa: BLE001 - a case that raised is rows in the parent, never a dead worker
            answer = ("failed", f"{type(exc).__name__}: {exc}")
        try:
            conn.send(answer)
        except Exception as exc:  # noqa: BLE001 - rows that do not pickle
            conn.send(("failed", f"its rows could not be sent back ({type(exc).__name__}: {exc})"))


def _ended(exitcode: int | None) -> str:
    """How a process ended, in words: ``exit code 3``, ``signal SIGSEGV``."""
    if exitcode is None:
        return "no exit code"
    if exitcode < 0:
        try:
            return f"signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"


def _stderr_excerpt(path: str, lines: tuple[int, int] = STDERR_LINES) -> str:
    """The first and last non-empty lines of a worker's stderr for its case, joined by " | " (" | ... | " where
    lines are left out; each line cut at 300 characters; empty when it wrote nothing)."""
    try:
        with open(path, "rb") as f:
            text = f.read(1 << 20).decode("utf-8", "replace")
    except OSError:
        return ""
    kept = [line.strip()[:300] for line in text.splitlines() if line.strip()]
    head, tail = lines
    if len(kept) > head + tail:
        kept = kept[:head] + ["..."] + kept[-tail:]
    return " | ".join(kept)


class _Worker:
    """One spawned process (never forked: the parent has jax's and torch's threads running), the case it holds and
    the cases it has held (``seen``: their programs are compiled in it)."""

    def __init__(self, context, log_dir: str):
        fd, self.log = tempfile.mkstemp(prefix="worker-", suffix=".stderr", dir=log_dir)
        os.close(fd)
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, self.log), daemon=True)
        self.process.start()
        child.close()
        self.future: concurrent.futures.Future | None = None
        self.deadline = float("inf")
        self.seen: set[str] = set()

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.conn.close()
        with contextlib.suppress(OSError):
            os.unlink(self.log)


class _Pool:
    """Up to ``size`` workers, each running one case at a time; a case past ``timeout`` seconds (None: no limit)
    is stopped with its worker. :meth:`submit` gives a future that :meth:`poll` settles: the case's result, or a
    :class:`CaseLost` that says how its worker ended."""

    def __init__(self, size: int, timeout: float | None):
        self.size, self.timeout = size, timeout
        self._context = multiprocessing.get_context("spawn")
        self._log_dir = tempfile.mkdtemp(prefix="parity-workers-")
        self._workers: list[_Worker] = []

    def rank(self, case: Case) -> int:
        """How well a worker free now suits the case: 0, one that held it before is idle (a causality pass after
        the leg's, another leg of the same case: its programs are compiled there); 1, no live worker held it;
        2, the one that did is busy."""
        homes = [w for w in self._workers if case.id in w.seen]
        if any(w.future is None for w in homes):
            return 0
        return 2 if homes else 1

    def submit(self, job: _Walk, case: Case) -> concurrent.futures.Future:
        idle = min((w for w in self._workers if w.future is None), default=None,
                   key=lambda w: case.id not in w.seen)  # the case's own worker first
        if idle is None:
            if len(self._workers) >= self.size:
                raise RuntimeError("every worker holds a case")  # the caller keeps at most `size` in flight
            idle = _Worker(self._context, self._log_dir)
            self._workers.append(idle)
        try:
            idle.conn.send((job, case))
        except OSError:  # it died while idle: a fresh one takes the case
            idle.stop()
            self._workers.remove(idle)
            return self.submit(job, case)
        idle.future = concurrent.futures.Future()
        idle.seen.add(case.id)
        idle.deadline = time.monotonic() + self.timeout if self.timeout else float("inf")
        return idle.future

    def poll(self) -> None:
        """Settle every case whose worker answered, ended or ran out of time, waiting until the first does."""
        busy = [w for w in self._workers if w.future is not None]
        if not busy:
            return
        until = min(w.deadline for w in busy)
        limit = None if until == float("inf") else max(0.0, until - time.monotonic())
        ready = set(multiprocessing.connection.wait([w.conn for w in busy] + [w.process.sentinel for w in busy],
                                                    timeout=limit))
        now = time.monotonic()
        for w in busy:
            if w.conn in ready:
                try:
                    kind, value = w.conn.recv()
                except (EOFError, OSError):  # it died as it answered
                    ready.add(w.process.sentinel)
                else:
                    future, w.future = w.future, None
                    if kind == "rows":
                        future.set_result(value)
                    else:
                        future.set_exception(_WorkerFailed(value))
                    continue
            if w.process.sentinel in ready:
                w.process.join()
                self._lose(w, f"its process ended ({_ended(w.process.exitcode)}) before the case's rows came back")
            elif now >= w.deadline:
                self._lose(w, f"it ran past --case-timeout {self.timeout:g} s and was stopped")

    def _lose(self, worker: _Worker, how: str) -> None:
        excerpt = _stderr_excerpt(worker.log)
        worker.stop()
        self._workers.remove(worker)
        future, worker.future = worker.future, None
        future.set_exception(CaseLost(how + (f"; its stderr: {excerpt}" if excerpt else "; no stderr")))

    def close(self, wait: bool = True) -> None:
        """Tell idle workers to finish (``wait``), or stop every worker at once; cases still held are lost."""
        for w in self._workers:
            if wait and w.future is None:
                with contextlib.suppress(OSError, BrokenPipeError):
                    w.conn.send(None)
                w.process.join(timeout=10)
            w.stop()
        self._workers = []
        with contextlib.suppress(OSError):
            os.rmdir(self._log_dir)


class Workers:
    """A pool of up to ``jobs`` spawned processes, started on first need and shared by every leg of a command.
    ``jobs == 1`` runs a leg's cases in this process, as a run without workers always has, unless the leg's cases
    have a time limit (``case_timeout``, else the leg spec's): then each runs in a worker of its own."""

    def __init__(self, jobs: int):
        self.jobs = jobs
        self.sent = 0  # cases sent to a worker so far
        self.lost: list[str] = []  # the cases whose worker ended without their rows
        self._pool: _Pool | None = None

    def __enter__(self) -> "Workers":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(wait=exc_type is None)  # interrupted: stop the workers, their cases are left behind

    def close(self, wait: bool = True) -> None:
        if self._pool is not None:
            self._pool.close(wait=wait)
            self._pool = None

    def _submit(self, job: _Walk, case: Case, size: int, timeout: float | None) -> concurrent.futures.Future:
        if self._pool is not None and (self._pool.size, self._pool.timeout) != (size, timeout or None):
            self._pool.close()  # another leg's pool: at most `jobs` processes alive at once
            self._pool = None
        if self._pool is None:
            self._pool = _Pool(size, timeout or None)
        self.sent += 1
        return self._pool.submit(job, case)

    def run(self, runner: Runner, recipe: LegRecipe, cases: Iterable[Case],
            on_case: Callable[[Case, list[dict]], None], progress: str | None = None) -> None:
        """Every case's rows for the recipe's task (one of :data:`TASKS`; a compile's for its targets), handed to
        ``on_case`` in case order. ``runner`` is the parent's, built from ``recipe``: it settles what needs no leg
        run, and its leg cache's counters take the workers' too. ``jobs`` cases run at once; at one, all run
        here unless the recipe gives its cases a time limit.
        ``progress``: a progress bar's label (None: no bar)."""
        job = _Walk(next(_JOB_NUMBERS), recipe, tuple(runner.provenance.items()))
        task, targets = recipe.task, recipe.targets
        cases = list(cases)
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(cases), desc=progress, unit="case", dynamic_ncols=True,
                       disable=None)  # None: no bar when not on a terminal (CI logs)

        def hand_on(case: Case, rows: list[dict]) -> None:
            on_case(case, rows)
            if bar is not None:
                bar.update(1)

        at_once = self.jobs
        timeout = recipe.timeout
        try:
            if at_once <= 1 and timeout is None:
                for case in cases:
                    _stop_if_asked()
                    if bar is not None:
                        bar.set_postfix_str(case.id[-60:], refresh=True)
                    hand_on(case, settle(runner, case, task, targets))
            else:
                self._run_pooled(runner, job, cases, hand_on, at_once, timeout)
            _stop_if_asked()  # asked during the last case: the run stops as it would have before another
        finally:
            if bar is not None:
                bar.close()

    def _run_pooled(self, runner: Runner, job: _Walk, cases: list[Case], hand_on, at_once: int,
                    timeout: float | None) -> None:
        probe = copy.copy(runner)  # the same leg, caches and counters; it raises NotServed where a run is needed
        probe.run_leg = False
        cache = runner.leg_cache
        # [case, its rows, its future, or None while it waits for a worker], in case order
        queue: collections.deque[list] = collections.deque()

        def running() -> list[concurrent.futures.Future]:
            return [r for _, r in queue if isinstance(r, concurrent.futures.Future) and not r.done()]

        def waiting() -> list[list]:
            return [entry for entry in queue if entry[1] is None]

        def dispatch() -> None:
            """Give each free worker one of the first :data:`CHOICE` * ``at_once`` waiting cases: one it held
            before, else one no worker held, else the oldest (:meth:`_Pool.rank`)."""
            while (ready := waiting()) and len(running()) < at_once:
                rank = self._pool.rank if self._pool is not None else (lambda case: 1)
                entry = min(ready[:CHOICE * at_once], key=lambda e: rank(e[0]))  # the oldest of the best
                entry[1] = self._submit(job, entry[0], at_once, timeout)

        def flush() -> None:
            while queue:
                _stop_if_asked()
                case, result = queue[0]
                if isinstance(result, concurrent.futures.Future):
                    if not result.done():
                        return
                    result = self._collect(runner, job, case, result)
                elif result is None:  # waits for a worker
                    return
                queue.popleft()
                hand_on(case, result)

        def settled_here(case: Case) -> list[dict] | None:
            """The case's rows when it needs no leg run (nothing does for a compile; nothing is settled here for a
            leg whose cases are isolated: asking whether it supports a case may trace its kernels), else None."""
            if job.recipe.task == "compile" or timeout is not None:
                return None
            counts = (cache.hits, cache.misses) if cache is not None else None
            try:
                return settle(probe, case, job.recipe.task)
            except NotServed:
                if counts is not None:  # the worker counts this case's runs itself
                    cache.hits, cache.misses = counts
                return None

        def step() -> None:
            """Start what can start and hand on what is done; then, if a case is left, wait for a worker (one runs:
            a case that waits does so because every worker is busy)."""
            dispatch()
            flush()
            if queue:
                self._pool.poll()
                flush()

        for case in cases:  # a choice of waiting cases first, then one more for each that starts
            queue.append([case, settled_here(case)])
            flush()
            while len(waiting()) >= CHOICE * at_once:
                step()
        while queue:
            step()

    def _collect(self, runner: Runner, job: _Walk, case: Case, future: concurrent.futures.Future) -> list[dict]:
        """A finished case's rows; a worker that ended without them, or failed, makes error rows that say so."""
        try:
            rows, hits, misses = future.result()
        except CaseLost as exc:
            self.lost.append(case.id)
            return _failed(runner, job, case, f"lost: {exc}")
        except _WorkerFailed as exc:
            return _failed(runner, job, case, f"its worker failed: {' '.join(str(exc).split())[:500]}")
        except Exception as exc:  # noqa: BLE001 - a case that could not be sent or returned is rows, never an abort
            return _failed(runner, job, case,
                           f"its worker failed: {' '.join(f'{type(exc).__name__}: {exc}'.split())[:500]}")
        if runner.leg_cache is not None:
            runner.leg_cache.hits += hits
            runner.leg_cache.misses += misses
        return rows


def _failed(runner: Runner, job: _Walk, case: Case, reason: str) -> list[dict]:
    """Error rows for a case no worker settled: result, compile or causality rows."""
    if job.recipe.task == "compile":
        return compile_error_rows(case, job.recipe.targets, runner, reason)
    if job.recipe.task == "run":
        return runner.error_rows(case, reason)
    try:
        op = runner.op_of(case)
    except Exception:  # noqa: BLE001 - an unknown op still yields rows
        op = None
    return [dataclasses.asdict(r) for r in refused_rows(runner.leg.name, runner.provenance["mode"], op, case,
                                                         default_t0(case), Status.ERROR, reason)]
