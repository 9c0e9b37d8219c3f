"""Bindings of other teams' kernels to this harness, each an implementation a candidate leg can run
(:mod:`harness.legs.external`). Registered as entry points (pyproject.toml), so an installed peer is a leg."""
