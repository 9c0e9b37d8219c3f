"""Emulation layers used by the harness legs.

``triton_interpreter`` makes the Triton CPU interpreter (TRITON_INTERPRET=1)
behave like an H100 for the numerics that matter to the parity harness; see
its module docstring.
"""

from .triton_interpreter import (  # noqa: F401
    AutotuneRecord,
    bf16_bits_to_f32,
    enable_interpreter_mode,
    f32_to_bf16_bits,
    interpreter_mode_enabled,
    native_cuda_available,
    pinned_autotune,
    round_to_tf32,
    triton_emulation,
    triton_versions,
)
