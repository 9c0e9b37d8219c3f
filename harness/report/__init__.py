"""Rendering verdicts: parity.md (:mod:`~harness.report.reports`), the HTML page and heatmap
(:mod:`~harness.report.html_report`), JUnit XML (:mod:`~harness.report.junit`), and the peer tables
(:mod:`~harness.report.peer_report`, :mod:`~harness.report.peer_table`). Renderers read only rows and gate
results."""
