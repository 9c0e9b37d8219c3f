"""The legs, as data: one :class:`LegSpec` per leg, the way ``harness.ops`` has one descriptor per op.

A leg declares its name, its role (``reference``, ``baseline`` or ``candidate``), how it runs, the package
its rows' ``versions`` must name (a file whose rows say ``leg=gpu`` but name no triton was not made by the
GPU leg), what it needs installed, and how it is built. The CLI, the pytest plugin and the gate ask this
registry; the built-in legs are below, and any team's implementation joins as a candidate:

- on the command line, ``--impl NAME=module:object`` (every verb, and the pytest plugin's ``--parity-impl``);
- from an installed package, through the entry-point group :data:`ENTRY_POINT_GROUP`
  (``NAME = "module:object"``).

Either is registered without importing anything: a package whose entry point does not load breaks no command
but one that runs its leg. Building the leg (:func:`make_leg`) loads the object, and :func:`check_implementation`
does so before a command's work: a module that does not import, an object that is not there or one without
``bindings`` is a ValueError of one line (the CLI's exit 2).

The object is an :class:`harness.legs.external.Implementation`: per op, a binding of forward (and optionally
a differentiable one), refusals and packed sequences (docs/legs.md, "Gating your own implementation").
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import importlib.util
import re
import warnings
from typing import Any, Callable, Mapping

from harness.core.schema import LEG_NAME, well_formed  # noqa: F401  (the form of a name: the rows' schema)

ROLES = ("reference", "baseline", "candidate")
ENTRY_POINT_GROUP = "linear_attn_parity.implementations"
NAME = LEG_NAME


@dataclasses.dataclass(frozen=True)
class LegSpec:
    name: str
    role: str  # one of ROLES
    runs: str  # how it runs, in words (native where the hardware is, else emulated)
    version_key: str  # the package its rows' ``versions`` name
    requires: tuple[str, ...]  # importable modules it needs
    install: str  # how to get them
    build: Callable[..., Any]  # options -> a harness.legs.base.Leg
    # the sources (globs in this repository) its output depends on besides the op's binding: a leg that
    # declares them has its outputs kept by harness.run.baseline_cache (the baselines, and this project's own
    # TPU kernels, keyed by every module their binding imports); an external candidate declares none
    cache_sources: tuple[str, ...] = ()

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"leg {self.name!r}: role {self.role!r} must be one of {ROLES}")
        if not NAME.match(self.name):
            raise ValueError(f"leg name {self.name!r} must be lower-case letters, digits, '-' or '_'")

    def missing(self) -> str | None:
        """None when every required module imports here, else why the leg cannot run."""
        absent = [m for m in self.requires if importlib.util.find_spec(m) is None]
        return f"missing {', '.join(absent)} ({self.install})" if absent else None


def _builder(module: str, cls: str):
    def build(**options):
        return getattr(importlib.import_module(module), cls)(**options)

    return build


BUILTIN = (
    LegSpec("ref", "reference", "native, on the CPU: the float64 reference recomputed another way", "numpy",
            ("jax",), "pip install -e .", _builder("harness.legs.ref", "RefLeg"),
            # its recurrent recompute: the references and the argument contract they check
            cache_sources=("harness/legs/ref.py", "references/**/*.py", "op_contract/**/*.py", "cases/inputs.py")),
    LegSpec("gpu", "baseline", "fla's Triton kernels: native on CUDA, else the Triton interpreter", "triton",
            ("torch", "triton", "fla"), "pip install -e '.[gpu]'", _builder("harness.legs.gpu", "GpuLeg"),
            cache_sources=("harness/emulation/**/*.py", "harness/legs/gpu.py")),
    LegSpec("tpu", "candidate", "this project's Pallas kernels: native on a TPU, else interpret mode", "libtpu",
            ("jax",), "pip install -e '.[tpu]'", _builder("harness.legs.tpu", "TpuLeg"),
            # its interpret mode's grid walk and ref reshapes too (the GPU leg's glob over-includes those: safe)
            cache_sources=("harness/legs/tpu.py", "harness/compile/tpu_compile.py", "harness/compile/tpu_env.py",
                           "harness/emulation/pallas_batched.py", "harness/emulation/pallas_refs.py")),
)

_LEGS: dict[str, LegSpec] = {spec.name: spec for spec in BUILTIN}
_entry_points_loaded = False


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in _LEGS:
            try:
                register_implementation(ep.name, ep.value)
            except ValueError as exc:  # one package's bad entry point must not stop every command
                warnings.warn(f"entry point {ep.name} = {ep.value!r} ({ENTRY_POINT_GROUP}) ignored: {exc}",
                              stacklevel=2)


def register_implementation(name: str, target: str) -> LegSpec:
    """A candidate leg ``name`` running the implementation at ``target`` (``module:object``, imported on first
    use). Re-registering a name with the same target is a no-op; another target, or a built-in leg's name,
    is a ValueError."""
    if ":" not in target or not all(target.split(":", 1)):
        raise ValueError(f"implementation {name}={target!r} must be module:object")
    existing = _LEGS.get(name)
    if existing is not None:
        if getattr(existing.build, "target", None) == target:
            return existing
        raise ValueError(f"leg {name!r} is already registered ({existing.runs}); choose another name")

    def build(**options):
        from .external import ExternalLeg

        load_implementation(name, target)
        return ExternalLeg(name, target, **options)

    build.target = target
    module = target.split(":", 1)[0]
    spec = LegSpec(name, "candidate", f"the implementation {target}: native on a TPU, else interpret mode",
                   name, (module.split(".", 1)[0], "jax"), f"install the package that provides {module}",
                   build)
    _LEGS[name] = spec
    return spec


def load_implementation(name: str, target: str):
    """The object at ``target`` (``module:object``), registered as ``name``: a ValueError of one line that says the
    fix when its module does not import, the object is not in it, or it has no ``bindings`` (a mapping of op
    name to :class:`harness.ops.base.LegBinding`)."""
    from .external import load

    try:
        impl = load(target)
    except Exception as exc:  # noqa: BLE001 - whatever their package raises while imported, in one line
        first = next(iter(str(exc).strip().splitlines()), "")
        raise ValueError(f"implementation {name}={target} does not load ({type(exc).__name__}: {first}): install "
                         f"the package that provides it, or correct module:object") from None
    bindings = getattr(impl, "bindings", None)
    if not isinstance(bindings, Mapping) or not bindings:
        raise ValueError(f"implementation {name}={target} has no bindings: its object needs `bindings`, a mapping "
                         f"of op name to harness.ops.base.LegBinding (docs/legs.md, Gating your own implementation)")
    return impl


def check_implementation(name: str) -> None:
    """That the leg ``name`` exists and, if it is an implementation (entry point, --impl), that its object loads
    (:func:`load_implementation`): one ValueError before any work."""
    target = getattr(leg_spec(name).build, "target", None)
    if target is not None:
        load_implementation(name, target)


def implementations() -> dict[str, str]:
    """Every registered implementation (entry points, --impl) by name -> its ``module:object`` target: what
    another process needs to register them again."""
    return {name: spec.build.target for name, spec in legs().items() if hasattr(spec.build, "target")}


def parse_impl(text: str) -> tuple[str, str]:
    """``NAME=module:object`` -> (name, target); a malformed value is a ValueError that says the form."""
    name, sep, target = text.partition("=")
    if not sep or not name or ":" not in target:
        raise ValueError(f"--impl {text!r} must be NAME=module:object, e.g. mykernels=my_pkg.parity:IMPLEMENTATION")
    return name.strip(), target.strip()


def legs() -> dict[str, LegSpec]:
    """Every registered leg by name: the built-in ones, then implementations (entry points, --impl)."""
    _load_entry_points()
    return dict(_LEGS)


def leg_spec(name: str) -> LegSpec:
    known = legs()
    if name not in known:
        raise ValueError(f"unknown leg {name!r}; choose one of {', '.join(known)} "
                         f"(or register an implementation: --impl NAME=module:object)")
    return known[name]


def version_key(name: str) -> str:
    """The package a leg's rows name in ``versions``; a leg not registered here (rows of an implementation
    made on another machine) names itself, as :class:`harness.legs.external.ExternalLeg` rows do."""
    known = legs()
    return known[name].version_key if name in known else name


def role_of(name: str) -> str:
    """A leg's role; a leg not registered here (an implementation's rows from another machine) is a candidate."""
    known = legs()
    return known[name].role if name in known else "candidate"



def default_leg(role: str) -> str:
    """The built-in leg of ``role``: what the gate compares unless told otherwise (gpu against tpu)."""
    return next(spec.name for spec in BUILTIN if spec.role == role)


def make_leg(name: str, **options):
    """Build a leg by name; heavy frameworks are imported only here, on demand. The leg carries the name it
    was registered under: the registry is the one place a leg's name is written."""
    leg = leg_spec(name).build(**options)
    leg.name = name
    return leg
