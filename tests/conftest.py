"""Test ordering for a 2-core CI: start the long end-to-end smoke run first, so that
pytest-xdist overlaps it with the unit tests instead of leaving it alone at the end."""

LONG_FIRST = ("test_smoke_e2e.py",)


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: item.path.name not in LONG_FIRST)  # stable: keeps the rest in order
