"""``parity bisect``: a candidate's rows over an ordered list of its versions (PyPI releases or commits of a local
checkout), each version installed once into a cached environment layered on this stack, judged by the gate
against one set of baseline rows; the first version where each comparison changes verdict, or the whole history.

- :mod:`.versions`: the ordered versions, with their release dates (read when the versions are resolved);
- :mod:`.envs`: one cached, isolated install per version (uv, ``--no-deps``, a target folder first on the path);
- :mod:`.history`: the per-version rows (resumable), the gate per version, the bisection and the sweep;
- :mod:`harness.report.bisect_report`: history.csv, .md, .png and .html.
"""
