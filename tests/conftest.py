"""Test ordering for a 2-core CI: start the long end-to-end smoke run first, so that
pytest-xdist overlaps it with the unit tests instead of leaving it alone at the end."""

LONG_FIRST = ("test_smoke_e2e.py",)


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: item.path.name not in LONG_FIRST)  # stable: keeps the rest in order


import pytest  # noqa: E402


@pytest.fixture
def inject(monkeypatch):
    """``inject(module, name, replacement)``: swap a named kernel helper for a faulty one, test side only.

    Kernels are traced lazily and their jitted wrappers are cached by static config, so jax's
    caches are cleared before the swap and after it is undone: no faulty trace outlives the test.
    """
    import jax

    def swap(module, name, replacement):
        jax.clear_caches()
        monkeypatch.setattr(module, name, replacement)

    yield swap
    monkeypatch.undo()
    jax.clear_caches()
