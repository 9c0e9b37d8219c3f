"""Compiling for real TPUs without one: libtpu's environment (:mod:`~harness.compile.tpu_env`), the deviceless
compile for v5e, v6e and v7x (:mod:`~harness.compile.tpu_compile`), Mosaic's dump read back with the MXU model
(:mod:`~harness.compile.mosaic_dump`) and XLA's own dots (:mod:`~harness.compile.xla_dots`). The TPU leg compiles
each case through it; ``parity compile`` sweeps it over suites (:mod:`harness.probes.compile_cases`)."""
