"""The parity harness: cases -> legs -> rows -> gate -> reports."""

from .tpu_compile import prepare_environment

# libtpu defaults (see tpu_compile.prepare_environment), set before any jax backend starts: with
# libtpu installed, jax loads it in every process, and its host-wide lock would stop a second one.
prepare_environment()
