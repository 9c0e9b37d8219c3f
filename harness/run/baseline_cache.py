"""The baseline cache: the GPU leg's results, kept on disk and reused while nothing they depend on moves.

The reference leg (the float64 recurrent recompute that cross-checks the chunked golden) is a baseline a
TPU change cannot move either, so its outputs are kept the same way, keyed by its own sources (the
references, the argument contract, the input conversion); its summary lines start with the leg's name.

A kernel engineer changing a TPU kernel re-runs the whole job, yet fla has not
changed: its leg (and its causality runs) would give the very same bits again.
So what the GPU leg returned for a case (every tensor it produced, the
per-case details, its wall time) is kept under
``$PARITY_CACHE_DIR/baselines/`` (the reference cache's directory) as one
``.npz`` per (case, inputs) and served instead of running fla again.

What is cached is the leg's *output*, not the rows: rows are rebuilt from it
by the runner as usual (golden, metrics, bounds, status), so a change of the
comparison code, the policy's bounds or the reference can never leave a stale
error column behind, and the causality check (which runs the leg on the case's
inputs and on perturbed copies of them) reuses the same entries: each run is
keyed by the sha256 of the inputs it was given.

The key (sha256 of a JSON record) covers:

- the case id and the input sha256;
- the leg's environment: its mode (``native`` or ``emulated``: a native run never
  reads an emulated entry, nor the reverse), device, versions (fla-core, triton,
  torch) and settings (the dot precision, the autotune pinning);
- the sources the leg's numerics depend on in this repository: the emulation
  layer (``harness/emulation/``), the leg (``harness/legs/gpu.py``, ``base.py``), the op model
  (``harness/ops/base.py``, ``cases/case.py``), and the module of every function
  the op descriptor's GPU binding points to (``forward``, ``supports``,
  ``describe``, ``differentiable``), found with :mod:`inspect`, so no op is named
  here. A binding whose source cannot be found is never cached.

An entry is used only when it reads cleanly, names its key and format, and
matches its checksum (name, dtype, shape and bytes of every array); anything
else is recomputed and atomically replaced with a :class:`BaselineCacheWarning`.

The TPU leg's outputs are kept the same way (the *candidate cache*), so that after an edit to one op's
kernels the warm loop re-runs that op's cases alone. Its code lives in this repository, so its key hashes
every module the op's binding imports from it, transitively (:func:`source_closure`: an edit to
``kernels_tpu/kda/`` moves kda's and gdn's keys, not simple_gla's; one to ``kernels_tpu/common.py`` moves
all), besides its environment (jax, jaxlib and libtpu versions, the interpret settings, the dot policy and
the compile targets). An entry is stored only after a clean preflight and is served with its columns (the
TPU targets it compiled for), so a served case skips the real-TPU compile too. An external candidate's
outputs are never cached.

Only completed runs with finite results are stored: a run that raised (an
``error`` or ``unsupported`` row, a crash, a timeout) or returned NaN/Inf is
recomputed next time, so a transient failure never sticks and a failure is
always reproduced for real. A served run says so in its rows' ``details``
(``"baseline_cache"``: when and at which commit it was computed); ``wall_s`` is the
original run's.
"""

from __future__ import annotations

import ast
import contextlib
import datetime as _dt
import functools
import hashlib
import inspect
import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping

import ml_dtypes
import numpy as np

from cases.case import Case
from cases.inputs import Inputs

from harness.legs.base import Leg, LegOutput
from harness.ops.base import OpDescriptor
from harness.core.content_key import files_digest
from harness.run.reference_cache import META_ENTRY, arrays_checksum, entry_metadata

_ROOT = Path(__file__).resolve().parents[2]  # the repository: harness/<stage>/<module>.py
SUBDIR = "baselines"
FORMAT = 1
COMMON_SOURCES = ("harness/legs/__init__.py", "harness/legs/base.py", "harness/legs/registry.py", "harness/ops/base.py",
           "harness/ops/serving.py", "cases/case.py")
"""What every cached leg's output depends on; each leg adds its own (``LegSpec.cache_sources``)."""

LABEL = "baseline cache"
CANDIDATE_LABEL = "candidate cache"
"""What a candidate's cache is called (this project's TPU kernels: served only while every source they import
is unchanged); the baselines' (fla, the reference leg's recompute) is :data:`LABEL`."""


def cached(leg_name: str) -> bool:
    """Whether a leg's outputs are cached: the legs that declare their sources (the baselines a candidate's
    change cannot move: fla, and the reference leg's cross-check; and this project's TPU kernels, keyed by
    every module their binding imports), never an external candidate (no sources here to key it by)."""
    from harness.legs.registry import legs

    spec = legs().get(leg_name)
    return spec is not None and bool(spec.cache_sources)


def for_leg(leg: Leg, read: bool = True, cache_dir: Path | None = None) -> "BaselineCache | None":
    """The cache a run of ``leg`` uses (under the caches' root ``cache_dir``; None: in memory only), or None for a
    leg that is not cached."""
    if not cached(leg.name):
        return None
    return BaselineCache(leg, under(cache_dir), read=read)


class BaselineCacheWarning(UserWarning):
    """A baseline cache entry was not used: it is recomputed and replaced."""


def under(cache_dir: Path | None) -> Path | None:
    """The legs' output cache under the caches' root ``cache_dir`` (``<root>/baselines``); None for none."""
    return None if cache_dir is None else Path(cache_dir) / SUBDIR


def sources_fingerprint(leg: str) -> str:
    """sha256 of the sources the cached leg ``leg``'s output depends on (:data:`COMMON_SOURCES` and its own)."""
    from harness.legs.registry import leg_spec

    return files_digest(p for pattern in COMMON_SOURCES + leg_spec(leg).cache_sources for p in _ROOT.glob(pattern))


def leg_inputs(leg_name: str, cases) -> dict:
    """What a cached leg's outputs on ``cases`` are a function of, as this cache keys them, for a record of work
    made from those outputs (``parity ptx --reuse``: the launches the GPU leg makes): the leg, the case ids, its
    environment (mode, device, versions, settings), :func:`sources_fingerprint` and each op's
    :func:`binding_fingerprint`. ValueError for a leg that is not cached (nothing here to key it by)."""
    from harness.legs import make_leg
    from harness.ops import get_op

    if not cached(leg_name):
        raise ValueError(f"the {leg_name} leg is not cached: its outputs have no key")
    leg = make_leg(leg_name)
    env = leg.environment()
    ops = sorted({case.op for case in cases})
    return {"leg": leg_name, "cases": [case.id for case in cases],
            "environment": json.loads(json.dumps({"mode": env.mode, "device": env.device, "versions": env.versions,
                                                  "settings": env.settings}, sort_keys=True, default=str)),
            "sources": sources_fingerprint(leg_name),
            "bindings": {name: binding_fingerprint(get_op(name), leg) for name in ops}}


def source_file(fn: Callable) -> str | None:
    """The file ``fn`` is defined in, through partials and ``functools.wraps`` wrappers in any nesting (a wrapper
    of a partial, as the serving options wrap a descriptor's ``functools.partial``, is the partial's function's)."""
    while True:
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif hasattr(fn, "__wrapped__"):
            fn = fn.__wrapped__
        else:
            break
    try:
        return inspect.getsourcefile(fn)
    except TypeError:  # a builtin or a C function: no source to hash
        return None


def _module_file(name: str, root: Path) -> Path | None:
    """The file of module ``name`` in the tree at ``root`` (a module or a package), or None (not in it)."""
    base = root.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _imported_modules(path: Path, root: Path) -> set[Path]:
    """The files under ``root`` that ``path`` imports anywhere in its body (function-level imports too).

    ``import a.b`` names a.b; ``from a import b`` names the module a.b where b is one, else a (b is defined
    there). A package that an import only passes through is not followed: its ``__init__`` is a registry."""
    inside = path.is_relative_to(root)
    package = list(path.relative_to(root).parts[:-1]) if inside else []  # a module's (an __init__'s own) package
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level and not inside:
                continue  # a relative import outside the tree: nothing of the tree's
            anchor = package[: len(package) - node.level + 1] if node.level else []
            base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                names.append(f"{base}.{alias.name}" if _module_file(f"{base}.{alias.name}", root) else base)
    found = (_module_file(name, root) for name in names if name)
    return {f for f in found if f is not None}


def source_closure(files, root: Path | None = None) -> set[Path]:
    """``files`` and every file under ``root`` (default: this repository) they import, transitively: what a
    kernel's numerics can depend on here, so an edit to one op's kernels changes that op's key and no other's."""
    root = (_ROOT if root is None else Path(root)).resolve()
    todo = [Path(f).resolve() for f in files]
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        todo.extend(_imported_modules(path, root) - seen)
    return seen


def binding_fingerprint(op: OpDescriptor, leg: Leg) -> str | None:
    """sha256 of the modules the functions ``leg`` runs ``op`` with are defined in (:meth:`Leg.sources`:
    its binding and the op's list of differentiable inputs, or the reference), plus the cotangent map;
    None when there are none, or one has no source file (such an op is never cached). A leg whose code
    lives in this repository (``Leg.source_closure``: the TPU kernels) hashes everything those modules
    import from it too (:func:`source_closure`)."""
    functions = leg.sources(op)
    files = [source_file(fn) for fn in functions]
    if not files or any(f is None or not os.path.isfile(f) for f in files):
        return None
    if leg.source_closure:
        files = [str(p) for p in source_closure(files)]
    return hashlib.sha256((files_digest(files) + json.dumps(dict(op.cotangents), sort_keys=True)).encode()).hexdigest()


def _finite(out: LegOutput) -> bool:
    return all(a is None or bool(np.isfinite(np.asarray(a, dtype=np.float64)).all()) for a in out.tensors.values())


class BaselineCache:
    """Leg outputs by (case, inputs, environment, sources). ``read=False`` recomputes every run and rewrites
    its entry (``--no-baseline-cache``); ``directory=None`` disables the cache."""

    def __init__(self, leg: Leg, directory: Path | None = None, read: bool = True):
        self.directory = Path(directory) if directory else None
        self.read = read
        self.leg = leg
        from harness.legs.registry import role_of

        self.label = CANDIDATE_LABEL if role_of(leg.name) == "candidate" else LABEL
        env = leg.environment()
        self._base = {"format": FORMAT, "leg": leg.name, "mode": env.mode, "device": env.device,
                      "versions": dict(env.versions), "settings": json.loads(json.dumps(dict(env.settings),
                                                                                       sort_keys=True, default=str)),
                      "sources": sources_fingerprint(leg.name)}
        self._bindings: dict[int, tuple[OpDescriptor, str | None]] = {}
        self.hits = 0
        self.misses = 0

    @property
    def enabled(self) -> bool:
        return self.directory is not None

    def key(self, op: OpDescriptor, case: Case, inputs: Inputs) -> str | None:
        """The entry's key, or None when the op's binding has no source to hash (then nothing is cached)."""
        return self.content_key(op, case, input_sha256=inputs.sha256)

    def content_key(self, op: OpDescriptor, case: Case, **more) -> str | None:
        """sha256 of what the leg's work on ``case`` depends on (its environment, sources and binding, the case)
        and of ``more`` (what else the work depends on: the inputs' hash for a run, the target and the compile's
        own sources for a compile), or None when the op's binding has no source to hash."""
        if id(op) not in self._bindings:  # per descriptor object (kept alive here, so its id is not reused)
            self._bindings[id(op)] = (op, binding_fingerprint(op, self.leg))
        binding = self._bindings[id(op)][1]
        if binding is None:
            return None
        record = {**self._base, "binding": binding, "case_id": case.id, **more}
        return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.npz"

    # ------------------------------------------------------------------ use
    def load(self, op: OpDescriptor, case: Case, inputs: Inputs) -> tuple[LegOutput, float] | None:
        """(the cached output, the original wall time), or None: then run the leg and :meth:`store` it."""
        if not self.enabled:
            return None
        key = self.key(op, case, inputs)
        if key is None or not self.read:
            self.misses += 1
            return None
        path = self._path(key)
        try:
            with np.load(path, allow_pickle=False) as data:
                arrays = {name: data[name] for name in data.files}
            found = _decode(arrays, key, self.label)
        except (FileNotFoundError, NotADirectoryError):
            self.misses += 1
            return None
        except Exception as exc:  # noqa: BLE001 - BadZipFile, zlib.error, EOFError...: a torn file is recomputed
            found = f"it is unreadable ({type(exc).__name__}: {' '.join(str(exc).split())})"
        if isinstance(found, str):
            warnings.warn(f"{self.label}: not using {path}: {found}; recomputing and replacing it",
                          BaselineCacheWarning, stacklevel=3)
            self.misses += 1
            return None
        self.hits += 1
        return found

    def store(self, op: OpDescriptor, case: Case, inputs: Inputs, out: LegOutput, wall_s: float,
              git_commit: str = "", facts: Mapping[str, Any] | None = None) -> bool:
        """Keep a completed run with finite results; True when it was written. Never raises for the disk.
        ``facts``: the clean preflight's row columns (the TPU targets compiled for), served with the output."""
        if not self.enabled or not _finite(out):
            return False
        key = self.key(op, case, inputs)
        if key is None:
            return False
        try:
            details = json.loads(json.dumps(dict(out.details), sort_keys=True, default=str))  # as rows write it
            columns = json.loads(json.dumps({**(facts or {}), **out.columns}))  # a column that is not JSON: not cached
        except (TypeError, ValueError):
            return False
        # C-contiguous, a 0-d array staying 0-d (np.ascontiguousarray would make it 1-d: a scalar g_gamma's gradient)
        arrays = {name: np.require(a, requirements="C") for name, a in out.tensors.items() if a is not None}
        served = {"case_id": case.id, "input_sha256": inputs.sha256,
                  "absent": sorted(n for n, a in out.tensors.items() if a is None),
                  "details": details, "columns": columns, "wall_s": float(wall_s),
                  "computed": {"timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                               "git_commit": git_commit}}
        meta = {"format": FORMAT, "key": key, **served,
                "tensors": {n: {"dtype": str(a.dtype), "shape": list(a.shape)} for n, a in arrays.items()},
                "sha256": arrays_checksum(arrays), "meta_sha256": _meta_checksum(served)}
        raw = {n: a.view(f"u{a.dtype.itemsize}") for n, a in arrays.items()}  # bf16 has no npz dtype: its bits
        raw[META_ENTRY] = np.frombuffer(json.dumps(meta, sort_keys=True).encode(), dtype=np.uint8)
        path, tmp = self._path(key), None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp.npz")
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **raw)
            os.replace(tmp, path)  # readers see the old entry or the whole new one
            return True
        except OSError:  # the cache is an optimisation: a read-only directory must not fail a run
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            return False

    def summary(self, hits: int, runs: int, what: str = "cases") -> str:
        """One line for the terminal: how many of ``runs`` came from the cache."""
        if not self.enabled:
            return f"{self.label} off (PARITY_CACHE_DIR is empty): {runs} {what} computed"
        if not self.read:
            return f"{runs} {what} recomputed, not read from the {self.label}; entries rewritten ({self.directory})"
        return f"{hits}/{runs} {what} from the {self.label} ({self.directory})"


_SERVED = ("case_id", "input_sha256", "absent", "details", "columns", "wall_s", "computed")
"""The metadata a hit serves besides the arrays: checked whole by ``meta_sha256`` (an edit to the TPU targets an
entry says it compiled for, or to its provenance, is a damaged entry like a flipped bit). An entry written before
it has none: unreadable, recomputed once (the format number stays, as it keys the committed compile records)."""


def _meta_checksum(served: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps({k: served[k] for k in _SERVED}, sort_keys=True).encode()).hexdigest()


def _decode(arrays: dict[str, np.ndarray], key: str, label: str = LABEL) -> tuple[LegOutput, float] | str:
    """The entry's output and wall time, or what is wrong with it."""
    meta = entry_metadata(arrays, key, FORMAT)
    if isinstance(meta, str):
        return meta
    tensors, checksum = meta["tensors"], meta["sha256"]
    try:
        absent, details, columns = meta["absent"], meta["details"], meta["columns"]
        wall, computed = float(meta["wall_s"]), dict(meta["computed"])
        if _meta_checksum(meta) != meta["meta_sha256"]:
            return "its metadata does not match its checksum (edited)"
    except (ValueError, KeyError, TypeError) as exc:
        return f"its metadata is unreadable ({type(exc).__name__})"
    out: dict[str, Any] = {}
    try:
        for name, spec in tensors.items():
            a = arrays[name].view(np.dtype(getattr(ml_dtypes, spec["dtype"], spec["dtype"])))  # bfloat16 too
            if list(a.shape) != spec["shape"]:
                return f"its {name} has shape {list(a.shape)}, its metadata says {spec['shape']}"
            out[name] = a
    except (TypeError, ValueError, KeyError) as exc:
        return f"its arrays do not match their metadata ({type(exc).__name__})"
    if arrays_checksum(out) != checksum:
        return "its checksum does not match its values"
    out.update({name: None for name in absent})
    details = {**details, label.replace(" ", "_"): f"served from the cache: computed {computed.get('timestamp', '?')} "
                                      f"at commit {computed.get('git_commit') or '?'}"}
    return LegOutput(tensors=out, details=details, columns=columns), wall
