"""The import paths modules had before harness/ was grouped by stage, kept working.

A user's binding, a CI template or a notebook may import ``harness.results`` or ``harness.gate``; each of
those names now resolves to the module of its stage package (``harness.core.results``, ``harness.judge.gate``),
the same module object, so attributes read or patched through either name are one. The table below is the only
list of moved modules: nothing in this repository imports the old names (tests/test_layers.py checks)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

MOVED = {
    "harness.status": "harness.core.status",
    "harness.metrics": "harness.core.metrics",
    "harness.noise": "harness.core.noise",
    "harness.policy": "harness.core.policy",
    "harness.results": "harness.core.results",
    "harness.tpu_compile": "harness.compile.tpu_compile",
    "harness.tpu_env": "harness.compile.tpu_env",
    "harness.mosaic_dump": "harness.compile.mosaic_dump",
    "harness.xla_dots": "harness.compile.xla_dots",
    "harness.runner": "harness.run.runner",
    "harness.result_file": "harness.run.result_file",
    "harness.baseline_cache": "harness.run.baseline_cache",
    "harness.reference_cache": "harness.run.reference_cache",
    "harness.causality": "harness.probes.causality",
    "harness.compile_cases": "harness.probes.compile_cases",
    "harness.mxu_probe": "harness.probes.mxu_probe",
    "harness.gate": "harness.judge.gate",
    "harness.calibrate": "harness.judge.calibrate",
    "harness.reports": "harness.report.reports",
    "harness.html_report": "harness.report.html_report",
    "harness.junit": "harness.report.junit",
    "harness.peer_report": "harness.report.peer_report",
    "harness.peer_table": "harness.report.peer_table",
    "harness.workers": "harness.app.workers",
}
"""Old module name -> the module it now is."""


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old name and loads it as the module it moved to (no second copy of its code)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        module = importlib.import_module(MOVED[spec.name])
        self._spec = module.__spec__  # the import system stamps the old name's spec on the module: put it back
        return module

    def exec_module(self, module):
        module.__spec__ = self._spec


def install() -> None:
    """Put the alias finder on ``sys.meta_path`` once."""
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.append(_Alias())
