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

import glob
import os

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
    """
    environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    if not tpu_attached(device_globs):
        for name, value in WITHOUT_A_TPU.items():
            environ.setdefault(name, value)
