"""Memory a job may use, one rule for the worker pool and the legs that keep state between cases.

``--jobs`` defaults to one worker per CPU and per :data:`GIB_PER_JOB` of physical memory
(:func:`harness.app.workers.default_jobs`), so each worker may hold that much; a leg that keeps compiled programs
between cases (the emulated TPU leg) frees them once its process holds more (:func:`resident_gib`)."""

from __future__ import annotations

import os

GIB_PER_JOB = 4
"""Memory a job may want: the float64 reference at the stress shape peaks at 3.75 GiB, the emulated TPU leg's
largest stress case at 3.57 GiB (reports/bench/2026-11-29-tpu-workers)."""


def resident_gib() -> float:
    """This process's resident memory in GiB (0.0 where Linux's /proc is absent)."""
    try:
        with open("/proc/self/statm") as f:
            resident_pages = int(f.read().split()[1])
        return resident_pages * os.sysconf("SC_PAGE_SIZE") / 2**30
    except (OSError, ValueError, IndexError):
        return 0.0
