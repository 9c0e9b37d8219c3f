"""Deterministic autotune: the config a kernel runs with is chosen by rule, never by timing;
used by emulated and native runs alike (same tiling, same reduction order)."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

from .patcher import Patcher

LOCK = threading.RLock()  # the interpreter keeps global state: one patch scope at a time


@dataclasses.dataclass(frozen=True)
class AutotuneRecord:
    """One deterministic autotune decision (one kernel, one tuning key)."""

    kernel: str
    key: Tuple[str, ...]
    config: Dict[str, Any]  # the config's kwargs (BT, BK, ...)
    num_warps: Optional[int]
    num_stages: Optional[int]
    num_ctas: Optional[int]
    index: int  # position in the kernel's declared config list
    n_configs: int  # declared configs
    n_candidates: int  # configs left after the kernel's own pruning
    rule: str

    def as_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    def short(self) -> str:
        kw = ",".join(f"{k}={v}" for k, v in sorted(self.config.items()))
        return f"{self.kernel}[{kw},w{self.num_warps},s{self.num_stages}]"


AutotuneRule = Union[str, Callable[[list, dict, dict], Any]]


class _AutotuneRecorder:

    def __init__(self) -> None:
        self._records: Dict[Tuple[str, Tuple[str, ...]], AutotuneRecord] = {}

    def add(self, rec: AutotuneRecord) -> None:
        self._records.setdefault((rec.kernel, rec.key), rec)

    def records(self) -> List[AutotuneRecord]:
        return list(self._records.values())


_RECORDERS: List[_AutotuneRecorder] = []


def _tuning_key(tuner, args, kwargs) -> Tuple[str, ...]:
    all_args = {**dict(zip(tuner.arg_names, args)), **kwargs}
    named = {k: v for k, v in all_args.items() if k in tuner.arg_names}
    key = [repr(named[k]) for k in tuner.keys if k in named]
    key += [str(v.dtype) for v in named.values() if hasattr(v, "dtype")]
    return tuple(key)


def _choose(rule: AutotuneRule, candidates: list, nargs: dict, kwargs: dict):
    if callable(rule):
        return rule(candidates, nargs, kwargs)
    if rule == "first":
        return candidates[0]
    if rule == "last":
        return candidates[-1]
    raise ValueError(f"unknown autotune rule {rule!r}")


def _make_pinned_run(rule: AutotuneRule):
    rule_name = rule if isinstance(rule, str) else getattr(rule, "__name__", "callable")

    def run(self, *args, **kwargs):
        # Replaces Autotuner.run: choose by rule instead of timing every config
        # (timing needs a driver, and a timing-based choice is not reproducible
        # across machines).  self.cache is neither read nor written, so FLA's
        # JSON config cache and earlier native tuning cannot leak in and the
        # autotuner is untouched after the block.
        self.nargs = dict(zip(self.arg_names, args))
        try:
            candidates = self.prune_configs(kwargs) if len(self.configs) > 1 else list(self.configs)
            config = _choose(rule, list(candidates), self.nargs, kwargs)
            self.best_config = config
            if _RECORDERS:
                try:
                    index = self.configs.index(config)
                except ValueError:
                    index = -1
                name = getattr(getattr(self, "base_fn", None), "__name__", None) or repr(self.fn)
                rec = AutotuneRecord(kernel=name, key=_tuning_key(self, args, kwargs), config=dict(config.kwargs),
                                     num_warps=getattr(config, "num_warps", None),
                                     num_stages=getattr(config, "num_stages", None),
                                     num_ctas=getattr(config, "num_ctas", None), index=index,
                                     n_configs=len(self.configs), n_candidates=len(candidates), rule=rule_name)
                for r in _RECORDERS:
                    r.add(rec)
            if config.pre_hook is not None:
                config.pre_hook({**self.nargs, **kwargs, **config.all_kwargs()})
            return self.fn.run(*args, **kwargs, **config.all_kwargs())
        finally:
            self.nargs = None

    return run


def _autotuner_classes() -> List[type]:
    from triton.runtime.autotuner import Autotuner

    out, todo = [], [Autotuner]
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo.extend(cls.__subclasses__())
    return out


def install_autotune_pin(patcher: Patcher, rule: AutotuneRule, recorder: _AutotuneRecorder) -> None:
    if isinstance(rule, str) and rule not in ("first", "last"):
        raise ValueError(f"unknown autotune rule {rule!r}")
    run = _make_pinned_run(rule)
    # Patch every loaded Autotuner class that defines its own run (fla's
    # CachedAutotuner does: it would first look up fla/configs/<GPU>/*.json).
    for cls in _autotuner_classes():
        if "run" in vars(cls):
            patcher.set_attr(cls, "run", run)
    _RECORDERS.append(recorder)

    def pop_recorder():
        _RECORDERS.remove(recorder)

    patcher.add_undo(pop_recorder)


class EmulationSession:
    """Handle returned by the context managers; read it inside or after the block."""

    def __init__(self, settings: Dict[str, Any]) -> None:
        self.settings = dict(settings)
        self._recorder = _AutotuneRecorder()
        self.reduce_order = None  # the ReduceOrder of the block (reduce_order), when it sums in the layout's order

    def autotune_records(self) -> List[AutotuneRecord]:
        """Every (kernel, tuning key) decision taken in the block, in order."""
        return self._recorder.records()

    def chosen_configs(self) -> Dict[str, List[Dict[str, Any]]]:
        """kernel name -> list of chosen configs (one per distinct tuning key)."""
        out: Dict[str, List[Dict[str, Any]]] = {}
        for r in self._recorder.records():
            out.setdefault(r.kernel, []).append({
                **r.config, "num_warps": r.num_warps, "num_stages": r.num_stages, "index": r.index, "key": r.key
            })
        return out

    def configs_summary(self) -> str:
        """Compact one-line string for a result row."""
        return ";".join(sorted({r.short() for r in self._recorder.records()}))


@contextlib.contextmanager
def pinned_autotune(rule: AutotuneRule = "first") -> Iterator[EmulationSession]:
    """Deterministic autotune config choice, for native *and* emulated runs.

    Inside the block every ``triton.autotune`` kernel runs the config picked by
    ``rule`` ("first": first config left after the kernel's own pruning, in
    declaration order; "last"; or ``callable(candidates, nargs, kwargs)``)
    without benchmarking.  ``session.autotune_records()`` lists the choices.
    """
    session = EmulationSession({"autotune_rule": rule if isinstance(rule, str) else "callable"})
    with LOCK:
        patcher = Patcher()
        try:
            install_autotune_pin(patcher, rule, session._recorder)
            yield session
        finally:
            patcher.restore()
