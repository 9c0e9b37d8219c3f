"""Test ordering for a 2-core CI: the longest files first (longest-processing-time-first scheduling), so that
pytest-xdist's two workers overlap them with the many short tests instead of leaving one of them alone at the end:
in `pytest -m heavy` the end-to-end smoke run, in the README's `pytest -n 2` the files whose tests each run whole
legs or compile many float64 references (each 1 to 4 minutes of a core, measured on the CI machine)."""

import os

LONG_FIRST = ("test_smoke_e2e.py", "test_workers.py", "test_reference_varlen.py", "test_state_layout.py",
              "test_user_cases.py", "test_tpu_compile.py", "test_pytest_plugin.py")

# The CLI's default is a worker process per CPU (harness.app.workers). Tests inject faults and fake legs into this
# process, which spawned workers would not see, and pytest-xdist already uses the cores: one process per test
# unless a test asks for workers (--jobs N) itself.
os.environ.setdefault("PARITY_JOBS", "1")


def pytest_collection_modifyitems(session, config, items):
    first = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))  # stable: keeps the rest in order


import pytest  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "needs_leg(name, ...): the test runs these legs; where a leg's frameworks "
                                       "are not installed (a TPU-side install has no torch) it is skipped, saying why")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Skip a ``needs_leg`` test before its fixtures (which may build the leg) are set up."""
    from harness.legs.registry import leg_spec

    for mark in item.iter_markers("needs_leg"):
        for name in mark.args:
            why = leg_spec(name).missing()
            if why:
                pytest.skip(f"needs the {name} leg: {why}")


@pytest.fixture
def inject(monkeypatch):
    """``inject(module, name, replacement)``: swap a named kernel helper for a faulty one, test side only.

    Kernels are traced lazily and their jitted wrappers are cached by static config, so jax's
    caches are cleared before the swap and after it is undone: no faulty trace outlives the test.
    The on-disk caches are switched off too: the TPU leg's outputs are keyed by its source files, which a
    swap in memory does not change, so no faulty output is stored and no clean one served.
    """
    import jax

    def swap(module, name, replacement):
        jax.clear_caches()
        monkeypatch.setenv("PARITY_CACHE_DIR", "")
        monkeypatch.setattr(module, name, replacement)

    yield swap
    monkeypatch.undo()
    jax.clear_caches()


@pytest.fixture
def faulty(tmp_path, monkeypatch):
    """Registers nothing yet: returns the --impl arguments of the faulty binding, its module on the path of this
    process and of the workers it spawns."""
    from faults import FAULTY
    from harness.legs import registry

    (tmp_path / "faulty_impl.py").write_text(FAULTY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setattr(registry, "_LEGS", {spec.name: spec for spec in registry.BUILTIN})
    monkeypatch.setenv("PARITY_CACHE_DIR", str(tmp_path / "cache"))
    return ["--backend", "faulty", "--impl", "faulty=faulty_impl:IMPLEMENTATION"]
