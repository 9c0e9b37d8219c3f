"""The runner: cases x one leg -> rows. One failing case never stops a run.

For each case: validate it, draw its inputs, ask the leg whether it supports
the case, run the leg, compute the float64 golden (cached by input hash), and
compare every declared tensor (a ``leg_cache``, :mod:`harness.run.baseline_cache`, may serve
the leg's output instead of running it). Every outcome is a row:

=============== =============================================================
status          meaning
=============== =============================================================
``ok``          compared, finite, within the absolute bound
``bound``       compared, finite, rel_l2 above the absolute bound
``nonfinite``   NaN/Inf in the leg's result where the reference is finite
``not_provided`` the leg returns no such tensor (e.g. fla's dg_gamma), or its binding declares no
                gradient of that input by design (``LegBinding.no_gradient``)
``unsupported`` the leg cannot run the case; ``reason`` says why
``error``       validation, input generation, the leg or the reference raised
=============== =============================================================
"""

from __future__ import annotations

import concurrent.futures
import datetime as _dt
import importlib.metadata
import json
import os
import re
import sys
import time
import traceback
from typing import Mapping

from cases.case import Case
from cases.inputs import Inputs, make_inputs

from harness.run.baseline_cache import BaselineCache
from harness.legs.base import Leg, LegOutput
from harness.core.metrics import compare, condition_number, nonfinite_where_ref_finite
from harness.ops import get_op
from harness.ops.base import OpDescriptor, grad_name
from harness.ops.reductions import magnitude_name, reduction_of
from harness.legs.registry import ENTRY_POINT_GROUP, legs, role_of
from harness.core.provenance import git_commit
from harness.core.policy import CONTRIBUTIONS, REFERENCE, bound_for
from harness.run.reference_cache import ReferenceCache
from harness.core.results import TRACEBACK
from harness.core.status import FAILING, FORWARD_ONLY, NO_GRADIENT, Status

FAILING_STATUSES = FAILING  # the name tests and plugins import



def impl_option(name: str) -> str:
    """`` --impl NAME=module:object`` where the leg ``name`` is an implementation no installed entry point
    provides (registered with ``--impl``): what a command that reruns its cases needs; else ``""``."""
    spec = legs().get(name)
    target = getattr(spec.build, "target", None) if spec is not None else None
    if target is None:
        return ""
    key = (name, target, tuple(sys.path))  # asked once per row: the installed entry points read once per path
    if key not in _IMPL_OPTION:
        provided = any(ep.name == name and ep.value.strip() == target
                       for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
        _IMPL_OPTION[key] = "" if provided else f" --impl {name}={target}"
    return _IMPL_OPTION[key]


_IMPL_OPTION: dict[tuple, str] = {}


def repro(leg: str, case_id: str) -> str:
    """The command that runs the case on the leg again; a leg registered with ``--impl`` names it there too."""
    return f"parity run --backend {leg}{impl_option(leg)} --case '{case_id}'"


EMBEDDED_TRACEBACK = "Traceback (most recent call last):"


def short_error(exc: BaseException) -> str:
    """The exception's type and message on one line, plus where in our code it surfaced. An error that carries
    the traceback of another raised inside a callback (jax's ``CpuCallback error``, e.g. a check of Pallas's TPU
    interpreter) is named by that one's last line, which says what happened."""
    text = str(exc)
    if EMBEDDED_TRACEBACK in text:  # its frames are indented; the exception, from its first unindented line on
        lines = text.split(EMBEDDED_TRACEBACK, 1)[1].splitlines()
        start = next((i for i, line in enumerate(lines) if line.strip() and not line[0].isspace()), None)
        text = text if start is None else "in a callback, " + " ".join(lines[start:])
    msg = " ".join(f"{type(exc).__name__}: {text}".split())
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "site-packages" not in f.filename]
    where = f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
    return (msg[:500] + ("..." if len(msg) > 500 else "")) + where


PLATFORM_CHECK = re.compile(r"not (supported|available|implemented) (on|for) (the |this )?(cpu|host)\b|"
                            r"(requires?|only (supported|runs?|available) on) (an? )?tpu", re.IGNORECASE)
"""A library's own refusal of the CPU it found in an emulated run (tokamax's ``Not supported on cpu``, ``requires a
TPU``)."""

PLATFORM_NOTE = ("; this is the library's own device check, not the case: it asked jax which device it runs on and "
                 "found this machine's, where the harness interprets its Pallas kernels (and compiles them for real "
                 "TPUs apart). A binding reaches the kernel past the check, calling the implementation beneath it "
                 "(e.g. an op object's own forward, or the kernel function the check guards), never the library's "
                 "reference in its place: docs/legs.md#a-library-that-checks-its-device")


def platform_refusal(message: str, mode: str) -> str:
    """``message``, with :data:`PLATFORM_NOTE` after it when it is a library's refusal of the CPU an emulated
    (``mode``) run found; on a real device such a refusal is the library's word on that device, kept as it is."""
    return message + PLATFORM_NOTE if mode == "emulated" and PLATFORM_CHECK.search(message) else message


def _traceback(exc: BaseException) -> str:
    """The exception's whole traceback, its causes and contexts included, as Python prints it: what an error
    row's one-line reason leaves out (kept beside the rows, :data:`harness.core.results.TRACEBACK`)."""
    return "".join(traceback.format_exception(exc))


def _raised_through(exc: BaseException, fn) -> bool:
    """Whether ``exc`` came out of a call of the function ``fn`` (its frame is in the traceback)."""
    code = getattr(fn, "__code__", None)
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is code:
            return True
        tb = tb.tb_next
    return False


class Refusal(Exception):
    """A case stops before its comparison: every row of it gets ``status`` and ``reason`` (and ``columns``)."""

    def __init__(self, op: OpDescriptor | None, status: str, reason: str, **columns):
        super().__init__(reason)
        self.op, self.status, self.reason, self.columns = op, status, reason, columns


class NotServed(Exception):
    """A runner built with ``run_leg=False`` met a case whose leg must run: :mod:`harness.app.workers` sends it to a
    worker process."""


def mapping_share() -> float:
    """The share of ``vm.max_map_count`` this process's memory mappings take (0 where Linux's /proc is absent)."""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            limit = int(f.read())
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f) / limit
    except (OSError, ValueError):
        return 0.0


def drop_compiles_if_crowded() -> None:
    """Drop jax's compiled functions once this process holds half the memory mappings it may: every compiled CPU
    executable holds mappings of its own, and a process has at most ``vm.max_map_count`` (65530 by default; one
    process walking the 3600 case-draws of smoke and regressions, reports/calibration/fresh24, grew by 250 to 900
    mappings a minute and was killed by LLVM's ``mmap error: 12`` after 1335 of them)."""
    if mapping_share() > 0.5:
        import jax  # the legs and the reference load it anyway; the runner itself needs it only here

        jax.clear_caches()


class Runner:
    """Runs one leg over cases; rows carry the run's provenance."""

    def __init__(self, leg: Leg, reference_cache: ReferenceCache | None = None, suite: str = "",
                 ops: Mapping[str, OpDescriptor] | None = None, leg_cache: BaselineCache | None = None,
                 run_leg: bool = True):
        """``ops`` overrides the registry (tests inject fault-carrying descriptors this way); ``leg_cache``
        serves and keeps the leg's outputs (:mod:`harness.run.baseline_cache`; None: the leg always runs);
        ``run_leg=False``: settle only what needs no leg run, raise :class:`NotServed` for the rest."""
        self.leg = leg
        self.run_leg = run_leg
        self.ops = ops
        self.cache = reference_cache or ReferenceCache()
        self.leg_cache = leg_cache
        self._compiled_for: Case | None = None  # the last case run, its seed cleared (:meth:`_keep_compiles_for`)
        env = leg.environment()
        self.provenance = {
            "leg": leg.name,
            "mode": env.mode,
            "device": env.device,
            "versions": json.dumps(dict(env.versions), sort_keys=True),
            "settings": json.dumps(dict(env.settings), sort_keys=True, default=str),
            "git_commit": git_commit() or "unknown",
            "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "suite": suite,
        }

    # ------------------------------------------------------------------ rows
    def _row(self, case: Case, tensor: str, tensor_dtype: str, status: str, **extra) -> dict:
        row = {
            "case_id": case.id,
            "op": case.op,
            "variant": case.variant,
            "dtype": case.dtype,
            "draw": case.seed,
            "tensor": tensor,
            "tensor_dtype": tensor_dtype,
            "status": status,
            "reason": "",
            **self.provenance,
            "repro": repro(self.leg.name, case.id),
        }
        row.update(extra)
        return row

    def _rows_for_all(self, op: OpDescriptor | None, case: Case, status: str, reason: str, **extra) -> list[dict]:
        """One row per declared tensor (or one ``*`` row when the case is invalid)."""
        try:
            specs = [(t.name, t.resolve_dtype(case)) for t in op.tensors(case)] if op else []
        except Exception:  # noqa: BLE001 - a broken descriptor must still yield a row
            specs = []
        specs = specs or [("*", "")]
        return [self._row(case, name, dtype, status, reason=reason, **extra) for name, dtype in specs]

    def op_of(self, case: Case) -> OpDescriptor:
        """The case's op: from the runner's ``ops`` when given, else from the registry."""
        return self.ops[case.op] if self.ops is not None else get_op(case.op)

    def error_rows(self, case: Case, reason: str) -> list[dict]:
        """Error rows for every tensor of ``case``."""
        try:
            op = self.op_of(case)
        except Exception:  # noqa: BLE001 - an unknown op still yields a row
            op = None
        return self._rows_for_all(op, case, Status.ERROR, reason)

    # ------------------------------------------------------------------- run
    def prepare(self, case: Case):
        """(op, inputs) of a valid case this leg supports; otherwise raises :class:`Refusal`."""
        op = None
        try:
            op = self.op_of(case)
            op.validate(case)
            inputs = make_inputs(case, op.inputs(case))
        except Exception as exc:  # noqa: BLE001 - an invalid case is rows, never an abort
            raise Refusal(op, Status.ERROR, f"invalid case: {short_error(exc)}",
                          **{TRACEBACK: _traceback(exc)}) from None
        try:
            reason = self.leg.supports(op, case)
        except Exception as exc:  # noqa: BLE001 - e.g. kernels that raise on a valid case while asked (TPU leg)
            binding = self.leg.binding(op)
            # the TPU-side legs ask the kernels by tracing the binding's forward: say so when that is what raised
            what = ("forward failed while tracing for the refusal check"
                    if binding is not None and _raised_through(exc, binding.forward) else "supports failed")
            raise Refusal(op, Status.ERROR, f"{what}: {short_error(exc)}", input_sha256=inputs.sha256,
                          **{TRACEBACK: _traceback(exc)}) from None
        if reason:
            raise Refusal(op, Status.UNSUPPORTED, platform_refusal(reason, self.provenance["mode"]),
                          input_sha256=inputs.sha256)
        try:
            self.no_gradient(op, case)
        except ValueError as exc:
            raise Refusal(op, Status.ERROR, str(exc), input_sha256=inputs.sha256) from None
        return op, inputs

    def no_gradient(self, op: OpDescriptor, case: Case) -> dict[str, str]:
        """{gradient tensor: its row's reason} for the inputs whose gradient the leg's binding declares it gives
        none of by design (``LegBinding.no_gradient``). A declaration that names anything but a differentiable
        input of the case, or gives no reason, is a ValueError that says so."""
        binding = self.leg.binding(op)
        if binding is None:
            return {}
        try:
            declared = dict(binding.no_gradient(case))
        except Exception as exc:  # noqa: BLE001 - the binding's own bug is the case's error rows
            raise ValueError(f"the {self.leg.name} binding's no_gradient failed: {short_error(exc)}") from None
        inputs = op.differentiable(case)
        for name, why in declared.items():
            if name not in inputs:
                raise ValueError(f"the {self.leg.name} binding of {op.name} declares no gradient for {name!r}, "
                                 f"which is not a differentiable input of this case ({', '.join(inputs)}): "
                                 f"declare only those (LegBinding.no_gradient)")
            if not isinstance(why, str) or not why.strip():
                raise ValueError(f"the {self.leg.name} binding of {op.name} declares no gradient for {name!r} "
                                 f"without a reason: give the reason, a non-empty string")
        return {grad_name(name): f"{NO_GRADIENT}: {why}" for name, why in declared.items()}

    def execute(self, op: OpDescriptor, case: Case, inputs: Inputs) -> tuple[LegOutput, dict]:
        """The leg's preflight and its run: (output, row columns); otherwise raises :class:`Refusal`.

        An output ``leg_cache`` serves skips both: it was stored only after a clean preflight, whose columns
        (the TPU targets compiled for) it carries. Otherwise the preflight (the emulated TPU leg's compile
        for real TPUs) runs in a thread beside the run, which needs nothing from it: both are mostly XLA
        compiles that release the GIL. Its verdict still rules: a failed preflight makes the case an error
        row whatever the run gave."""
        cached = self.leg_cache.load(op, case, inputs) if self.leg_cache is not None else None
        if cached is not None:
            out, wall_s = cached  # the original run's time; its details say it was served
            return out, {"input_sha256": inputs.sha256, "wall_s": wall_s}
        if not self.run_leg:
            raise NotServed(case.id)
        self.leg.start_case(case)  # before the preflight thread: nothing of the leg's runs beside it yet
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="preflight") as pool:
            preflight = pool.submit(self._preflight, op, case, inputs)
            try:
                out, wall_s = self._run(op, case, inputs)
                refused = None
            except Refusal as r:
                refused = r
            problem, facts = preflight.result()
        common = {"input_sha256": inputs.sha256, **facts}
        if problem and refused is None:  # the run's numbers stay beside the failed preflight, in error rows
            return out, {**common, "wall_s": wall_s, PREFLIGHT_PROBLEM: problem}
        if problem:
            raise Refusal(op, Status.ERROR, problem, **common)
        if refused is not None:
            raise Refusal(op, refused.status, refused.reason, **{**common, **refused.columns})
        common["wall_s"] = wall_s
        if self.leg_cache is not None and out.backward_error is None:  # a failed backward is run again, never served
            self.leg_cache.store(op, case, inputs, out, wall_s, self.provenance["git_commit"], facts=facts)
        return out, common

    def _preflight(self, op: OpDescriptor, case: Case, inputs: Inputs) -> tuple[str | None, dict]:
        try:
            return self.leg.preflight(op, case, inputs)
        except Exception as exc:  # noqa: BLE001
            return f"preflight failed: {short_error(exc)}", {}

    def _run(self, op: OpDescriptor, case: Case, inputs: Inputs) -> tuple[LegOutput, float]:
        """(the leg's output, its wall time)."""
        t0 = time.perf_counter()
        try:
            out = self.leg.run(op, case, inputs)
        except NotImplementedError as exc:
            # the kernel's own validation: a valid case this leg does not implement
            raise Refusal(op, Status.UNSUPPORTED, platform_refusal(short_error(exc), self.provenance["mode"]),
                          input_sha256=inputs.sha256) from None
        except Exception as exc:  # noqa: BLE001 - a failing case is rows, never an abort
            raise Refusal(op, Status.ERROR, platform_refusal(short_error(exc), self.provenance["mode"]),
                          input_sha256=inputs.sha256,
                          wall_s=time.perf_counter() - t0, **{TRACEBACK: _traceback(exc)}) from None
        return out, time.perf_counter() - t0

    def _keep_compiles_for(self, case: Case) -> None:
        """On a new case, :func:`drop_compiles_if_crowded`. Draws of one case (ids that differ only in ``seed=N``)
        always keep the leg's and the reference's compiles, and so do the cases of a short run, which share
        many."""
        key = case.replace(seed=0)
        if self._compiled_for is not None and key != self._compiled_for:
            drop_compiles_if_crowded()
        self._compiled_for = key

    def run_case(self, case: Case) -> list[dict]:
        self._keep_compiles_for(case)
        try:
            op, inputs = self.prepare(case)
            out, common = self.execute(op, case, inputs)  # first: a case sent to a worker needs no golden here
            try:
                golden = self.cache.get(op, case, inputs)
            except Exception as exc:  # noqa: BLE001
                raise Refusal(op, Status.ERROR, f"reference failed: {short_error(exc)}",
                              **{**common, "input_sha256": inputs.sha256, TRACEBACK: _traceback(exc)}) from None
        except Refusal as r:
            return self._rows_for_all(r.op, case, r.status, r.reason, **r.columns)
        problem = common.pop(PREFLIGHT_PROBLEM, None)
        common["details"] = json.dumps(dict(out.details), sort_keys=True, default=str)
        common.update(out.columns)
        no_gradient = {} if out.forward_only else self.no_gradient(op, case)  # checked by prepare
        rows = [self._compare_row(op, case, spec, out.tensors.get(spec.name), golden, common, out.forward_only,
                                  no_gradient.get(spec.name)) for spec in op.tensors(case)]
        if out.backward_error is not None:
            rows = [_backward_error(row, out.backward_error) if spec.kind == "grad" else row
                    for spec, row in zip(op.tensors(case), rows)]
        return rows if problem is None else [_preflight_error(row, problem) for row in rows]

    def _compare_row(self, op, case, spec, y, golden, common, forward_only=False, no_gradient=None) -> dict:
        """``no_gradient``: the reason the binding gives no such gradient by design; then whatever ``y`` holds
        (zeros, as a forward that takes the input as a constant gives) is not compared."""
        dtype = spec.resolve_dtype(case)
        reduction = reduction_of(spec)
        bound = bound_for(case.op, spec.name, case.dtype, role_of(self.leg.name),
                          over=REFERENCE if reduction is None else CONTRIBUTIONS)
        kappa = None if reduction is None else condition_number(golden[spec.name],
                                                                 golden[magnitude_name(spec.name)])
        limit = bound.limit(kappa)
        common = {**common, "bound_rel_l2": limit, "bound_over": bound.over, "kappa": kappa}
        if y is None or no_gradient:
            reason = no_gradient or (f"{FORWARD_ONLY} {spec.name}" if forward_only and spec.kind == "grad"
                                     else f"the {self.leg.name} leg does not return {spec.name}")
            return self._row(case, spec.name, dtype, Status.NOT_PROVIDED, reason=reason, **common)
        r = golden[spec.name]
        metrics = compare(y, r, dtype)
        if "shape_error" in metrics:
            return self._row(case, spec.name, dtype, Status.ERROR, reason=metrics["shape_error"], **common)
        bad = nonfinite_where_ref_finite(y, r)
        if bad:
            status, reason = Status.NONFINITE, f"{bad} NaN/Inf values where the reference is finite"
        elif not metrics["rel_l2"] <= limit:
            over = "" if kappa is None else (f" = {bound.rel_l2:g} x kappa {kappa:.3g}, the sum's condition number "
                                             f"(its terms' magnitudes over it)")
            status, reason = Status.BOUND, f"rel_l2 {metrics['rel_l2']:.3g} > bound {limit:.3g}{over} ({bound.reason})"
        else:
            status, reason = Status.OK, ""
        return self._row(case, spec.name, dtype, status, reason=reason, **metrics, **common)


PREFLIGHT_PROBLEM = "_preflight_problem"
"""The key :meth:`Runner.execute` hands a failed preflight's reason under when the run itself gave numbers."""


def _backward_error(row: dict, exc: BaseException) -> dict:
    """A gradient row of a case whose backward raised after its forward ran: an ``error`` with the exception (the
    forward's rows are compared as usual)."""
    if row["status"] in (Status.NOT_PROVIDED,) and row["reason"].startswith(NO_GRADIENT):
        return row  # declared absent by design: nothing was asked of the backward for it
    return {**row, "status": Status.ERROR, "reason": f"the backward failed after the forward ran: "
                                                     f"{short_error(exc)}", TRACEBACK: _traceback(exc)}


def _preflight_error(row: dict, problem: str) -> dict:
    """A compared row of a case whose preflight failed (the emulated TPU legs: the compile for a real TPU): an
    ``error`` with the preflight's reason, its numbers kept and the emulated run's outcome said after it."""
    if row["status"] in (Status.OK, Status.BOUND, Status.NONFINITE):
        got = f"rel_l2 {row['rel_l2']:.3g}, max_abs {row['max_abs']:.3g}"
        said = f"{row['status']}: {row['reason']}" if row["reason"] else "within its bound"
        problem = f"{problem} [the emulated run gave {got} ({said})]"
    elif row["reason"]:
        problem = f"{problem} [the emulated run: {row['status']}, {row['reason']}]"
    return {**row, "status": Status.ERROR, "reason": problem}


def shard(cases: list[Case], index: int, count: int) -> list[Case]:
    """Deterministic shard ``index`` of ``count`` (0-based): every count-th case of the suite order."""
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"shard {index}/{count} is invalid: use i/n with 0 <= i < n")
    return cases[index::count]


def parse_shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard {text!r} must look like i/n, e.g. 0/2") from None
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"--shard {text!r}: need 0 <= i < n")
    return i, n
