"""The parity harness: cases -> legs -> rows -> gate -> reports, grouped by stage (docs/architecture.md)."""

from harness.compile.tpu_env import prepare_environment
from harness.compile.xla_cache import use_compilation_cache

# libtpu defaults (harness.compile.tpu_env), set before any jax backend starts: with libtpu installed, jax loads it
# in every process; its host-wide lock would stop a second one, and without a TPU its start-up is noisy.
prepare_environment()
# the CPU's compiled programs kept across processes and runs (harness.compile.xla_cache), under the caches' root
use_compilation_cache()
