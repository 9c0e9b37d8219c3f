"""libtpu's process environment, set before any jax backend starts (``harness/__init__.py`` calls
:func:`prepare_environment` on import).

With libtpu installed (the ``cpu`` and ``tpu`` extras), jax loads it in every process, TPU or not. On a
machine without a TPU it then prints start-up errors that read like a broken install ("Failed to find host
bounds for accelerator type", "E0000 ... INVALID_ARGUMENT: Error: unexpected worker hostname ..."). Naming a
topology and a worker silences it; ahead-of-time compiles name their own targets (v5e, v6e, v7x) and still
work. Every value is a default: a value the user set is kept, and a machine with a TPU attached gets none of
the TPU-less defaults.
"""

from __future__ import annotations

import atexit
import glob
import importlib.util
import os
import re
import shutil
import tempfile

MOSAIC_DUMP_FLAG = "--xla_mosaic_dump_to"
"""libtpu's flag (in ``LIBTPU_INIT_ARGS``) for the directory Mosaic dumps its passes into."""

MOSAIC_DUMP_OWNER = "PARITY_MOSAIC_DUMP_PID"
"""Set beside the harness's own ``--xla_mosaic_dump_to``: the process that made the directory. A child
process (a worker) inherits both, and makes its own."""

TPU_DEVICE_GLOBS = ("/dev/accel[0-9]*", "/dev/vfio/[0-9]*")
"""Where a TPU VM's chips appear: ``/dev/accelN`` (v2-v4, v5p) or VFIO groups (v5e, v6e, v7x)."""

WITHOUT_A_TPU = {"TPU_ACCELERATOR_TYPE": "v6e-4", "TPU_WORKER_HOSTNAMES": "localhost"}
"""libtpu's start-up answers on a machine with no TPU: any topology silences the host-bounds and
worker-hostname errors (measured with libtpu 0.0.42.1; compiles for other generations are unaffected)."""


def tpu_attached(device_globs=TPU_DEVICE_GLOBS) -> bool:
    """Whether this machine exposes TPU chips (device files only: nothing is loaded)."""
    return any(glob.glob(pattern) for pattern in device_globs)


def prepare_environment(environ=os.environ, device_globs=TPU_DEVICE_GLOBS) -> None:
    """Set libtpu's defaults in ``environ``; call before jax initialises backends.

    - ``ALLOW_MULTIPLE_LIBTPU_LOAD=1``: libtpu otherwise takes a host-wide lock file on load, so a second
      process (a pytest-xdist worker, a concurrent run) could not compile.
    - ``TPU_SKIP_MDS_QUERY=1``: no look-ups of a cloud metadata server.
    - :data:`WITHOUT_A_TPU`, only where :func:`tpu_attached` is false: a silent start.
    - Also only there, Mosaic's passes dumped for the compile's MXU check (:func:`dump_mosaic_passes`); on a
      TPU host the native runs compile every program, so the dump is left to the user's own flag.
    """
    environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    if not tpu_attached(device_globs):
        for name, value in WITHOUT_A_TPU.items():
            if not environ.get(name):  # unset, or set empty (``TPU_ACCELERATOR_TYPE= parity ...``): no topology either
                environ[name] = value
        dump_mosaic_passes(environ)


def dump_mosaic_passes(environ=os.environ) -> None:
    """Have libtpu dump Mosaic's passes into a directory of this process's own, removed at exit, so that
    every compile can read what Mosaic emitted (:mod:`harness.compile.mosaic_dump`). A ``--xla_mosaic_dump_to`` the
    user set is kept (and only read). Without libtpu, nothing is set."""
    flags = environ.get("LIBTPU_INIT_ARGS", "")
    owner = environ.get(MOSAIC_DUMP_OWNER)
    if importlib.util.find_spec("libtpu") is None or owner == str(os.getpid()):
        return
    if MOSAIC_DUMP_FLAG in flags and owner is None:
        return  # the user's own
    path = tempfile.mkdtemp(prefix="parity-mosaic-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    flags = re.sub(r"\s*" + re.escape(MOSAIC_DUMP_FLAG) + r"=\S+", "", flags)  # a parent process's, inherited
    environ["LIBTPU_INIT_ARGS"] = f"{flags} {MOSAIC_DUMP_FLAG}={path}".strip()
    environ[MOSAIC_DUMP_OWNER] = str(os.getpid())
