"""The bottom of the harness: what every stage reads and no stage produces.

- :mod:`~harness.core.schema`: the columns, statuses and modes of every row and record file;
- :mod:`~harness.core.status`: what a row's status means (failing, forward only, no gradient);
- :mod:`~harness.core.metrics`: max-abs, rel-L2 (and its blocks), ULP, the comparator;
- :mod:`~harness.core.noise`: the block bootstrap and the sequential test's looks;
- :mod:`~harness.core.policy`: the parity policy and the absolute bounds;
- :mod:`~harness.core.results`: result files read, checked, merged and written atomically;
- :mod:`~harness.core.provenance`: this checkout's commit.

Nothing here imports a leg, a runner, the gate or a report."""
