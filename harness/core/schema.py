"""The schema every stage reads: the columns of a result row and of a compile row, the statuses a result row may
carry, the modes a leg runs in and the form of a leg's name. Declared once here; the producers (the legs, the
runner, the real-TPU compile, the reading of Mosaic's dump) fill these columns, and the readers (the result
files, the gate, the reports) check against them. This module imports nothing but the words of
:mod:`harness.core.status`."""

from __future__ import annotations

import re

from harness.core.status import Status

METRICS = ("max_abs", "rel_l2", "ulp_max", "ulp_mean", "ulp_p99")
"""The comparator's metrics (definitions: :mod:`harness.core.metrics`, docs/definitions.md)."""

MODES = ("native", "emulated")
"""How a leg ran: on its hardware, or emulated on a CPU (the Triton interpreter, Pallas interpret mode)."""

LEG_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")
"""The form of a leg's name: a result file may come from an implementation not installed here."""


def well_formed(name: str) -> bool:
    """Whether ``name`` can be a leg's name (:data:`LEG_NAME`)."""
    return bool(LEG_NAME.match(str(name)))


KERNEL_COLUMNS = ("kernels_traced", "kernels_mosaic")
"""Rows' counts: Pallas kernels in the traced program (forward and backward), and how many of them reached
Mosaic (a ``tpu_custom_call`` in the program XLA:TPU compiled)."""

MOSAIC_COLUMNS = ("mxu_dots", "mxu_passes_model", "mxu_passes_mosaic", "mxu_check")
"""Rows' columns: the kernels' dots (each as written, once); their passes summed, as the model runs them and as
Mosaic's LLO shows them (equal when verified); and ``verified``, ``mismatch`` or ``unverified: why``."""

MEMORY_COLUMNS = ("mem_argument_bytes", "mem_output_bytes", "mem_alias_bytes", "mem_temp_bytes", "mem_code_bytes")
"""A compile row's memory footprint per chip, in bytes, as libtpu's compiled memory statistics give it."""

MXU_COLUMNS = ["mxu_cost", "mxu_macs_fwd", "mxu_macs_bwd", "mxu_pass_macs_fwd", "mxu_pass_macs_bwd"]
"""TPU rows, emulated: modeled MXU work (kernels_tpu.mxu.MxuTally), not a timing."""

RESULT_COLUMNS = [
    "case_id", "op", "variant", "dtype", "draw", "tensor", "tensor_dtype", "leg", "status", "reason",
    *METRICS, "rel_l2_blocks", "numel", "nan", "inf", "ref_nonfinite", "worst_index", "ref_at_worst", "got_at_worst",
    "bound_rel_l2", "bound_over", "kappa",
    "input_sha256", "mode", "device", "compiled_for", *KERNEL_COLUMNS, *MOSAIC_COLUMNS, *MXU_COLUMNS, "versions",
    "settings", "details", "git_commit", "timestamp", "suite", "wall_s", "repro",
]
"""A leg's result file: one row per (case, tensor), in this order."""

KEY = ["case_id", "tensor"]
"""What names a row within one leg's file."""

REQUIRED_COLUMNS = ["case_id", "tensor", "leg", "status", "reason", "input_sha256", "mode", *METRICS, "rel_l2_blocks"]
"""Columns a result file must have for the gate to judge it."""

RESULT_STATUSES = (Status.OK, Status.BOUND, Status.NONFINITE, Status.NOT_PROVIDED, Status.UNSUPPORTED,
                   Status.ERROR)
"""The statuses a result row may carry (causality rows add ``leak``)."""

COMPILE_MODE = "aot"
"""compile.csv's ``mode``: compiled ahead of time by libtpu for a TPU topology; nothing ran on a TPU."""

COMPILE_COLUMNS = [
    "case_id", "op", "variant", "dtype", "target", "topology", "mode", "status", "reason", "compile_s", "error",
    *KERNEL_COLUMNS, *MOSAIC_COLUMNS, *MEMORY_COLUMNS, "hbm_bytes", "program", "jax", "jaxlib", "libtpu",
    "input_sha256", "git_commit", "timestamp", "content_key", "reused_from", "repro",
]
"""``parity compile``'s file: one row per (case, target)."""
