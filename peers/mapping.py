"""What the peer bindings share when they map a case onto a serving kernel: its requests, and the state slots a
call must leave alone.

A serving kernel takes packed requests (``cu_seqlens`` / ``query_start_loc``) and a pooled state buffer indexed by
slot. A case's requests are its packed sequences, or one per batch row; a binding gives each request the slots it
reads and writes, and every other slot of the pool (a prefix cache's read blocks, another request's state) must
come back bit for bit as it went in.
"""

from __future__ import annotations

import numpy as np


def requests(case) -> tuple[tuple[int, ...], list[int]]:
    """(offsets, lengths) of the case's requests: its packed sequences (``cu_seqlens``), or one per batch row."""
    offsets = tuple(case.cu_seqlens) if case.cu_seqlens is not None else tuple(range(0, case.B * case.T + 1,
                                                                                     case.T))
    return offsets, [b - a for a, b in zip(offsets, offsets[1:])]


class SlotWritten(RuntimeError):
    """A kernel changed a state slot it was given only to read (or not given at all)."""


def check_kept(expected, got, slots, what: str) -> None:
    """Raise :class:`SlotWritten` naming every slot ``slots[i]`` whose contents ``got[i]`` after the call differ,
    in any bit, from ``expected[i]``, what the binding put there. NaN bits count as bits. Under a trace (the
    compile step traces shapes only) there are no values to compare: nothing is checked."""
    import jax

    if any(isinstance(x, jax.core.Tracer) for x in (expected, got)):
        return
    expected, got = np.asarray(expected), np.asarray(got)
    if expected.shape != got.shape or expected.dtype != got.dtype:
        raise SlotWritten(f"{what}: slots {list(slots)} came back as {got.dtype}{list(got.shape)}, "
                          f"not {expected.dtype}{list(expected.shape)}")
    bits = np.dtype(f"u{expected.dtype.itemsize}")
    changed = {int(s): float(np.max(np.abs(got[i].astype(np.float64) - expected[i].astype(np.float64))))
               for i, s in enumerate(slots) if not np.array_equal(expected[i].view(bits), got[i].view(bits))}
    if changed:
        raise SlotWritten(f"{what}: slot(s) {sorted(changed)} changed by a call given them only to read (max "
                          f"|change| per slot: " + ", ".join(f"{s}: {d:.3g}" for s, d in changed.items()) + ")")


def raised_by(exc: BaseException, package_file: str) -> bool:
    """Whether ``exc`` was raised by a ``raise`` or ``assert`` line in the source of the package whose
    ``__init__.py`` is ``package_file``: the library's own input checks, which a binding reports as refusals in the
    library's words. An error raised inside jax while it traces the library's kernels is the library breaking, not
    refusing; jax's traceback filtering may drop its own frames and leave the library's call site last, a line that
    is a call, not a raise or an assert."""
    import linecache
    from pathlib import Path

    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    filename = tb.tb_frame.f_code.co_filename
    if not Path(filename).resolve().is_relative_to(Path(package_file).resolve().parent):
        return False
    return linecache.getline(filename, tb.tb_lineno).lstrip().startswith(("raise ", "assert "))



def provider(package: str, distribution: str, install: str) -> str | None:
    """None when the importable top-level ``package`` is the one ``distribution`` installed, else why not: not
    installed (``install`` says how), or its files are another distribution's. Two wheels may install one package
    name (gdn2-pallas and atomic-ops both install ``atomic_ops``); the last one installed overwrites the other's
    files in place, so the path cannot tell them apart: the package's ``__init__.py`` is checked against the hash
    ``distribution`` recorded for it."""
    import base64
    import hashlib
    import importlib.metadata
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return f"{distribution} is not installed ({install})"
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        owners = importlib.metadata.packages_distributions().get(package, [])
        return (f"{distribution} is not installed ({install}): the package {package} here is "
                f"{' and '.join(owners) or 'another distribution'}'s")
    init = next((f for f in dist.files or () if str(f) == f"{package}/__init__.py"), None)
    if init is None or Path(dist.locate_file(init)).resolve() != Path(spec.origin).resolve():
        return f"the package {package} imported from {Path(spec.origin).parent} is not {distribution}'s"
    if init.hash is not None:
        digest = base64.urlsafe_b64encode(hashlib.new(init.hash.mode, Path(spec.origin).read_bytes()).digest())
        if digest.rstrip(b"=").decode() != init.hash.value:
            others = [d for d in importlib.metadata.packages_distributions().get(package, []) if d != distribution]
            return (f"the package {package} here is not {distribution}'s: its files were overwritten by "
                    f"{' and '.join(others) or 'another install'} (both install {package}; give each an "
                    f"environment of its own)")
    return None


def import_provided(module: str, distribution: str, install: str, packages: tuple[str, ...] = ()):
    """``(module, None)`` imported, or ``(None, why)``: each of ``packages`` (default: ``module``'s top-level
    package) must be ``distribution``'s (:func:`provider`), and the import must succeed; any failure is the reason
    every row of the binding gives. Call it when the binding's module is imported, outside any trace."""
    import importlib

    for package in packages or (module.split(".")[0],):
        why = provider(package, distribution, install)
        if why:
            return None, why
    try:
        return importlib.import_module(module), None
    except Exception as exc:  # noqa: BLE001 - any import failure is the reason for every row
        return None, f"{distribution} could not be imported: {type(exc).__name__}: {exc}"


def refused_options(case, entry: str, refused: dict) -> str | None:
    """Why ``entry`` cannot take the case's options named in ``refused`` (option -> why, in the library's terms),
    or None when the case sets none of them."""
    given = [f"{name}: {why}" for name, why in refused.items() if case.opt.get(name)]
    return f"{entry} takes no " + "; ".join(given) if given else None
