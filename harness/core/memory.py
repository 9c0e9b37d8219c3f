"""Memory: what a job may use, what this process holds, what the machine has left.

``--jobs`` defaults to one worker per CPU and per :data:`GIB_PER_JOB` of physical memory
(:func:`harness.app.workers.default_jobs`). A leg that keeps compiled programs between cases (the emulated TPU leg)
frees them when its process holds a large share of the machine (:func:`resident_fraction`), or when the machine has
less than a job's memory left (:func:`available_gib`: with one worker per job, each under its own share could still
fill the machine together)."""

from __future__ import annotations

import os

GIB_PER_JOB = 4
"""Memory a job may want: the float64 reference at the stress shape peaks at 3.75 GiB, the emulated TPU leg's
largest stress case at 3.57 GiB (reports/bench/2026-11-29-tpu-workers)."""


def resident_fraction() -> float:
    """This process's resident memory over the machine's physical memory (0.0 where Linux's /proc is absent)."""
    try:
        with open("/proc/self/statm") as f:
            resident_pages = int(f.read().split()[1])
        return resident_pages / os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError, IndexError):
        return 0.0


def available_gib() -> float:
    """The machine's memory available to new work (Linux's MemAvailable), GiB; infinity where /proc is absent."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20  # kB
    except (OSError, ValueError, IndexError):
        pass
    return float("inf")
