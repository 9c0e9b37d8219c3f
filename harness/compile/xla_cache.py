"""jax's persistent compilation cache for the programs this harness compiles on the CPU.

**Why.** On a machine without an accelerator (CI, most users' CI) a small case's time is mostly XLA:CPU compiling:
the float64 references, the interpret-mode kernels, their gradients (reports/bench/2026-11-29-ci-time). The same
programs come back in other processes: pytest's workers, the CLI's worker processes, a re-run after an edit to one
op's kernels. jax's persistent cache serves them from disk. A served executable is the one compiled before, so
its results are the same bits.

**Where.** ``<cache root>/xla/<host>``: the root is :func:`harness.core.cache_dir.default_cache_dir`'s (no cache
when ``PARITY_CACHE_DIR`` is set empty), ``<host>`` a digest of what XLA:CPU compiles for (:func:`host_key`).
jax's key holds the program, jaxlib's version, the XLA flags, the compile options and the devices, but on the CPU
its platform version is the word ``cpu``: the host's instruction set, which decides whether ``a * b + c``
contracts and how wide a reduction is vectorised, is not in it. The directory puts it there, so a cache shared
between machines (a home directory on a network disk, a CI cache restored on another runner) never serves one
CPU's code on another.

**One flag left out of jax's key.** ``--xla_mosaic_dump_to`` (:mod:`harness.compile.tpu_env`) names a directory
of each process's own. It changes no program, but jax hashes ``LIBTPU_INIT_ARGS`` whole into every key, the CPU's
programs included, so with it no process would find another's entries (measured: two runs, 32 entries, no hit).
jax keeps a list of such flags (its dump options); this one is added to it.

**Never a real-TPU compile.** :func:`harness.compile.tpu_compile.compile_for` reads what Mosaic dumps while it
compiles, so a compile for a TPU target must run: it is never written (:func:`not_written`), and libtpu's
compile-only client could not load one back anyway. On a machine with a TPU attached the native legs compile for
the TPU itself, and jax's setting is left as the user has it.

**Not with jaxlib 0.9**, whose loader writes to stderr for every entry (:data:`SILENT_LOADER`).

**Decided once, by the front.** The first process that imports the harness (the CLI, pytest) puts jax's own
variables in its environment, and the processes it starts inherit them: a test that points ``PARITY_CACHE_DIR``
at a directory of its own, for its rows, still shares the programs. The user's own ``JAX_COMPILATION_CACHE_DIR``,
or ``jax_compilation_cache_dir`` set before the harness is imported, is kept.

The cache is not pruned: it grows by the programs first compiled (about 40 MB for the whole test suite); delete the
directory to clear it."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import math
import os
import platform
import re
from pathlib import Path

from harness.compile.tpu_env import MOSAIC_DUMP_FLAG, TPU_DEVICE_GLOBS, tpu_attached
from harness.core.cache_dir import default_cache_dir

SUBDIRECTORY = "xla"
"""The cache's place under the caches' root."""

DIRECTORY = "JAX_COMPILATION_CACHE_DIR"
"""jax's variable for its cache's directory."""

CPU_FIELDS = ("model name", "flags", "CPU implementer", "CPU part", "Features")
"""``/proc/cpuinfo``'s fields that say what code the host runs: x86's model and instruction set flags, Arm's
implementer, part and features (the first processor's; a machine's processors are alike)."""


def host_key(cpuinfo: str | None = None, machine: str | None = None) -> str:
    """16 hex digits of sha256 over the architecture and :data:`CPU_FIELDS` (``cpuinfo``: ``/proc/cpuinfo``'s
    text, read when None; where there is none, as on macOS, ``platform.processor()`` stands for it)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = platform.processor()
    parts = [machine if machine is not None else platform.machine()]
    for field in CPU_FIELDS:
        found = re.search(rf"^{re.escape(field)}\s*:\s*(.*?)\s*$", cpuinfo, re.MULTILINE)
        parts.append(f"{field}={found.group(1) if found else ''}")
    if not any(part.split("=", 1)[1] for part in parts[1:]):
        parts.append(cpuinfo.strip())  # no field known: the whole text (or processor name) decides
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


SILENT_LOADER = (0, 10)
"""The first jaxlib whose XLA:CPU loads an entry back without a word on stderr. jaxlib 0.9.2 writes two lines for
every entry it loads, on the machine that compiled it (measured in CI's tops stack): ``Assume version
compatibility. PjRt-IFRT does not track XLA executable versions.`` and ``Loading XLA:CPU AOT result. Target machine
feature +prefer-no-gather is not supported on the host machine`` (a tuning flag its check does not know, not an
instruction). 0.10.2 and 0.12 load silently. The harness starts silently (tests/test_tpu_env.py), so with an
older jaxlib it keeps no cache."""


def loads_silently(jaxlib_version: str | None = None) -> bool:
    """Whether ``jaxlib_version`` (the installed jaxlib's when None) is :data:`SILENT_LOADER` or later."""
    if jaxlib_version is None:
        try:
            jaxlib_version = importlib.metadata.version("jaxlib")
        except importlib.metadata.PackageNotFoundError:
            return False
    return tuple(int(n) for n in re.findall(r"\d+", jaxlib_version)[:2]) >= SILENT_LOADER


def cache_directory(environ=os.environ, device_globs=TPU_DEVICE_GLOBS) -> Path | None:
    """Where this process's cache goes (module doc); None where the harness keeps none: no cache root, a TPU
    attached, the user's own ``JAX_COMPILATION_CACHE_DIR``, or a jaxlib that loads an entry noisily."""
    root = default_cache_dir(environ)
    if root is None or tpu_attached(device_globs) or environ.get(DIRECTORY) or not loads_silently():
        return None
    return root / SUBDIRECTORY / host_key()


EVERY_PROGRAM = {"jax_persistent_cache_min_compile_time_secs": 0.0, "jax_persistent_cache_min_entry_size_bytes": 0}
"""jax's settings (its variables are their names in capitals) that keep every program however short its compile: a
case's programs are many and small, and reading one back takes about 2 ms."""


def cache_environment(environ=os.environ, device_globs=TPU_DEVICE_GLOBS) -> dict[str, str]:
    """The variables that put jax's cache at :func:`cache_directory` for this process and every process it starts
    (the CLI's workers, a test's commands): the front decides once, as for the harness's other caches. Empty where
    the harness keeps none; a minimum time or size the user set is theirs."""
    path = cache_directory(environ, device_globs)
    if path is None:
        return {}
    return {DIRECTORY: str(path), **{name.upper(): environ.get(name.upper(), str(value))
                                     for name, value in EVERY_PROGRAM.items()}}


def use_compilation_cache(environ=os.environ) -> Path | None:
    """Put :func:`cache_environment` in ``environ`` (and in jax's settings, where jax was imported first), and
    leave the harness's Mosaic dump directory out of jax's key whatever directory the cache is in (the module
    doc). Returns the cache's directory, or None when jax keeps none."""
    ours = cache_environment(environ)
    environ.update(ours)
    if not environ.get(DIRECTORY):
        return None
    import jax
    from jax._src import cache_key

    left_out = getattr(cache_key, "xla_flags_to_exclude_from_cache_key", None)  # jax 0.9.2 to 0.12 have it
    if left_out is not None and MOSAIC_DUMP_FLAG not in left_out:  # without it: correct, each process its own
        left_out.append(MOSAIC_DUMP_FLAG)
    if ours and not jax.config.jax_compilation_cache_dir:  # jax read its variables before they were set
        jax.config.update("jax_compilation_cache_dir", ours[DIRECTORY])
        for name, value in EVERY_PROGRAM.items():
            jax.config.update(name, type(value)(ours[name.upper()]))
    return Path(jax.config.jax_compilation_cache_dir or environ[DIRECTORY])


@contextlib.contextmanager
def not_written():
    """Compiles in this block (this thread) are never written to the persistent cache: jax writes an entry only
    for a compile that took at least the minimum time, here infinite."""
    from jax._src import config

    with config.persistent_cache_min_compile_time_secs(math.inf):
        yield
