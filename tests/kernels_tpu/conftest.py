"""Every kernel entry point (a function taking ``interpret``) a test module imports from ``kernels_tpu`` runs as the
emulated TPU leg runs it: one XLA:CPU program at the leg's optimization level (``like_the_leg.py`` says why: 2 to 3
times less compile, and every operation rounded as written)."""

import inspect

import pytest

from like_the_leg import like_the_leg


_WRAPPED: dict = {}  # one wrapper per entry point for the whole session: its programs serve every test


@pytest.fixture(autouse=True)
def kernels_compiled_like_the_leg(request, monkeypatch):
    module = request.module
    for name, value in list(vars(module).items()):
        if (inspect.isfunction(value) and value.__module__.startswith("kernels_tpu.") and not name.startswith("_")
                and "interpret" in inspect.signature(value).parameters):  # a kernel entry point
            if value not in _WRAPPED:
                _WRAPPED[value] = like_the_leg(value)
            monkeypatch.setattr(module, name, _WRAPPED[value])
