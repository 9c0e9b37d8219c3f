"""The emulated GPU leg's assumptions checked against Triton's own PTX for fla's kernels, per kernel, sm_80 and sm_90.

Three steps, the first two each in a fresh Python process:

1. **capture** (:mod:`.capture`): runs the leg as its caller's command gives it (``parity run --backend gpu`` over
   the cases, ``--jobs 1``: harness.app.ptx_leg) under the Triton interpreter, with the caches off, and records every
   kernel launch: the kernel (module, qualname) and the specialization Triton's own launcher would compile for it
   (``JITFunction`` binder and ``_pack_args`` with the CUDA backend: argument types, constexprs including the pinned
   autotune config and heuristics, divisibility attributes, ``num_warps`` / ``num_stages``).
2. **compile** (:mod:`.capture`): a process without interpreter mode imports fla (its
   kernels are then ``JITFunction`` objects) and compiles each distinct specialization with
   ``triton.compile(ASTSource(...), target=GPUTarget("cuda", cc, 32))``, keeping the TTIR and the PTX. The LLVM IR
   is also lowered to PTX a second time with FP fusion off (the backend's own ``make_ptx``), as a control that says
   which ``fma`` instructions exist only because the compiler contracted a multiply and an add.
3. **check** (this process): each PTX against :func:`harness.emulation.gpu_model.emulation_facts`, which probes
   the emulation itself (:data:`ASSUMPTIONS` lists the checks). One CSV row per kernel, target and assumption:
   ``match``, ``mismatch`` (the PTX contradicts the emulation), ``n/a`` (the kernel has no such operation) or
   ``error`` (it did not compile).

No GPU and no network: Triton's NVIDIA backend (its bundled LLVM) writes PTX on the CPU.

A sweep writes ``key.json`` beside its rows: :func:`content_key` of every input the rows are a function of (this
repository's code the sweep runs, the cases, triton / fla-core / torch / Python versions, the targets, the
emulation's facts). ``--reuse DIR`` serves a committed record of an earlier sweep instead of running one (about 12
minutes) when, and only when, its key is the current one and its rows are clean and unedited.

The package: :mod:`.parse` (reading TTIR and PTX), :mod:`.checks` (one check per assumption), :mod:`.capture` (the
two steps' processes), :mod:`.record` (the content key and ``--reuse``), and :func:`sweep` here.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

from harness.core.content_key import digest

from ..gpu_model import emulation_facts
from .capture import capture_launches, compile_kernels, read_launches
from .checks import (ASSUMPTIONS, CSV_COLUMNS, STATUSES, TARGETS, BadInput, Row, check_compiled,  # noqa: F401
                     check_contraction, check_exp_ex2, check_f32_div_sqrt, check_ieee_dot, check_kernel,
                     check_low_precision_dot, check_reduce_order, check_rounding_modes, check_subnormals,
                     check_tf32_dot, kernel_label, parse_targets, summarize, write_csv)
from .parse import TtirDot, ptx_body, ptx_instructions, ttir_dots, ttir_ops  # noqa: F401
from .record import (KEY_FILE, ROWS_FILE, content_key, copy_record, input_differences, key_files,  # noqa: F401
                     key_versions, launches_selection, read_record, record_command, reuse_verdict, row_counts,
                     selection_argv, write_key)


def sweep(*, backend: str, leg_inputs, capture_command=None, suite: str = "smoke", case: Sequence[str] = (),
          target: str = "sm80,sm90", out="reports/runs/ptx", launches: Optional[str] = None,
          reuse: Optional[str] = None) -> int:
    """``parity ptx``: record the GPU leg's fla launches over the cases (``suite``, or ``case`` ids), compile
    each for the ``target`` GPUs with Triton's own pipeline and check the emulation's assumptions in the PTX;
    ``launches``: an earlier run's launches, skip the capture; ``reuse``: a record that stands for this sweep
    when its key matches. ``leg_inputs(backend, suite, case)`` gives what the leg's outputs on the cases depend
    on (the record's key), ``capture_command(backend, suite, case, out)`` the command that runs the leg over them
    (both from the front: this layer knows no leg and no command line). Prints what it did; returns the exit
    status (0, 1 on a mismatch or a kernel that does
    not compile, 2 on bad input)."""
    t0 = time.time()
    case = list(case)
    given = launches  # ``launches`` is then the file the sweep reads: given, or captured here
    try:
        targets = parse_targets(target)
        if launches is not None and not Path(launches).is_file():
            raise BadInput(f"--launches: no such file {launches}")
        if not case:
            from cases.suites import SUITES

            unknown = [s for s in suite.split(",") if s.strip() not in SUITES]
            if unknown:
                raise BadInput(f"--suite: unknown {', '.join(unknown)}; known: {', '.join(SUITES)}")
        out = Path(out)
        if out.exists() and not out.is_dir():
            raise BadInput(f"--out: {out} is not a directory")
        record = read_record(Path(reuse)) if reuse is not None else None  # before a sweep into it rewrites it
        selection = selection_argv(suite, case)
        facts = emulation_facts()
        try:
            leg = leg_inputs(backend, suite, case)
        except ValueError as exc:
            raise BadInput(f"{'--case' if case else '--suite'}: {str(exc).splitlines()[0]}") from None
        current = content_key(selection, targets, leg_inputs=leg, facts=facts.as_dict())
    except BadInput as exc:
        print(f"parity ptx: error: {exc}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    if record is not None:
        why = reuse_verdict(record, current)
        if why is None:
            copy_record(record, out)
            line = summarize(record.rows, targets).removeprefix("ptx: ")
            print(f"ptx: verified by content: the record {record.directory} (made at "
                  f"{record.meta.get('made_at') or 'an unknown commit'}) was made from exactly these inputs (key "
                  f"{current['key'][:12]}); {line} -> {out / ROWS_FILE}")
            return 0
        print(f"ptx: not verified by the record {record.directory}: {why}; running the sweep")
    (out / KEY_FILE).unlink(missing_ok=True)  # key.json names the files beside it: none until this sweep's are
    provenance: dict = {}
    try:
        if given is not None:
            launches = Path(given)
            t_cap = 0.0
        else:
            with tempfile.TemporaryDirectory(prefix="parity-ptx-") as tmp:
                launches = out / "launches.json"
                tc = time.time()
                if capture_command is None:
                    raise RuntimeError("no command to run the leg was given: give --launches")
                capture_launches(capture_command(backend, suite, case, Path(tmp)), launches, out / "capture.log",
                                 leg=current["inputs"]["leg"], selection=list(selection))
                t_cap = time.time() - tc
        data = read_launches(Path(launches))
        if data.get("rc"):
            print(f"parity ptx: note: the GPU leg's run exited {data['rc']} (its launches are checked all the same)")
        if not data["specializations"]:
            print(f"parity ptx: error: no kernel launch recorded (capture log: {out / 'capture.log'})",
                  file=sys.stderr)
            return 2
        if given is not None:
            provenance = _keep_launches(launches, data, out, current, selection)
        provenance["capture_rc"] = data.get("rc") or 0
        tc = time.time()
        index = compile_kernels(Path(launches), out / "compiled", targets, out / "compile.log")
        t_comp = time.time() - tc
    except RuntimeError as exc:
        print(f"parity ptx: error: {exc}", file=sys.stderr)
        return 1
    rows = check_compiled(data, index, out / "compiled", facts)
    write_csv(rows, out / ROWS_FILE)
    (out / (ROWS_FILE + ".gz")).unlink(missing_ok=True)  # a record's gzipped rows from before: not these
    (out / "facts.json").write_text(json.dumps(facts.as_dict(), indent=1))
    keyed = provenance.pop("keyed", True)
    if keyed:
        write_key(out, current, rows, targets, **provenance)
    line = summarize(rows, targets)
    print(f"{line}; capture {t_cap:.0f} s, compile {t_comp:.0f} s, total {time.time() - t0:.0f} s -> {out / 'ptx.csv'}")
    bad = [r for r in rows if r.status in ("mismatch", "error")]
    for r in bad[:5]:
        print(f"  {r.status}: {r.kernel} {r.target} {r.assumption}: {r.found}")
    if len(bad) > 5:
        print(f"  ... {len(bad) - 5} more in {out / 'ptx.csv'}")
    if record is not None:
        command = record_command(selection, targets, record.directory)
        if bad:
            print(f"ptx: not recorded: a record with mismatch or error rows is never reused; once clean, to record it: "
                  f"{command}")
        elif not keyed:
            print(f"ptx: not recorded (no key.json: see the note above); to record it: {command}")
        elif out.resolve() == record.directory.resolve():
            print(f"ptx: recorded: {record.directory} now holds this sweep (key {current['key'][:12]}); commit it")
        else:
            print(f"ptx: to record it: {command}")
    return 1 if bad else 0


def _keep_launches(launches: Path, data: dict, out: Path, current: dict, selection: Sequence[str]) -> dict:
    """A sweep from ``--launches``: the file goes beside the rows (a record holds its launches), and key.json says
    where they came from. The key itself leaves the file out (:func:`content_key`); so that it still holds, the
    launches must come from a capture of this leg and selection, else no key.json is written (``keyed``: False)."""
    import shutil

    name = "launches.json" + (".gz" if launches.suffix == ".gz" else "")
    dest = out / name
    if not (dest.exists() and dest.resolve() == launches.resolve()):
        shutil.copyfile(launches, dest)
    other = out / ("launches.json" if name.endswith(".gz") else "launches.json.gz")
    other.unlink(missing_ok=True)
    provenance = {"launches_from": str(launches), "launches_sha256": digest(launches.read_bytes())}
    captured = launches_selection(data)
    if captured != (current["inputs"]["leg"], list(selection)):
        said = (f"a capture of `parity run --backend {captured[0]} {' '.join(captured[1])}`" if captured
                else "no capture command")
        print(f"parity ptx: note: no {KEY_FILE}: {launches} records {said}, not of this leg and selection "
              f"(--backend {current['inputs']['leg']} {' '.join(selection)})")
        provenance["keyed"] = False
    return provenance

