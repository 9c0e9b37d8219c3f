"""Emulation layers used by the harness legs.

``triton_interpreter`` makes the Triton CPU interpreter (TRITON_INTERPRET=1)
behave like an H100 for the numerics that matter to the parity harness; see
its module docstring. It is assembled from one module per fix: ``setup``
(interpreter mode, versions), ``bits`` (bf16/TF32 bit helpers), ``patcher``
(reversible patches), ``autotune`` (pinned configs, used natively too),
``loop_vars`` (tensor loop variables), ``handles`` (float values in and out
of interpreter tensors), ``bf16_arith`` (bf16 rounding), ``dots`` (tl.dot
numerics), ``comparisons`` (int1 comparison results) and ``fla_gather``
(fla's gather-free path); ``batched_grid`` runs a launch's programs in one pass.

The emulated TPU leg's interpreters live here too: ``pallas_batched`` (the
batched Pallas grid interpreter, ``batched_grid``'s twin for ``pallas_call``)
and ``pallas_refs`` (ref reshapes in Pallas's TPU interpreter).
"""

from .triton_interpreter import (  # noqa: F401
    EMULATED_TRITON,
    AutotuneRecord,
    bf16_bits_to_f32,
    emulation_problem,
    enable_interpreter_mode,
    f32_to_bf16_bits,
    interpreter_mode_enabled,
    native_cuda_available,
    pinned_autotune,
    round_to_tf32,
    triton_emulation,
    triton_versions,
)
