"""The sweep's two steps in processes of their own: **capture** (the leg's run under the Triton interpreter, with
every kernel launch recorded) and **compile** (each recorded specialization by Triton's own pipeline).

``python -m harness.emulation.ptx.capture capture OUT.json -- MODULE ARGS...`` runs ``python -m MODULE ARGS`` (the
command its caller hands it: this layer knows no leg and no command line) in this process under a
:class:`LaunchRecorder`; ``python -m harness.emulation.ptx.capture compile LAUNCHES OUT_DIR TARGETS`` compiles."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Sequence

from ..specialization import Specializer, compile_record
from .checks import TARGETS

def capture_main(out_json: str, argv: Sequence[str]) -> int:
    """``python -m MODULE ARGS`` (``argv``: MODULE, then ARGS) in this process, under the interpreter, with every
    kernel launch recorded into ``out_json`` with the run's exit status (``rc``) and its arguments
    (``parity_argv``)."""
    import runpy

    from ..setup import enable_interpreter_mode

    enable_interpreter_mode()  # before fla is imported, as the GPU leg does
    module, args = argv[0], list(argv[1:])
    recorder = LaunchRecorder()
    t0 = time.time()
    before = sys.argv
    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        rc = 0
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        recorder.close()
        sys.argv = before
    Path(out_json).write_text(json.dumps({"parity_argv": args, "rc": rc, "seconds": time.time() - t0,
                                          "specializations": list(recorder.records.values())}, indent=1))
    return 0  # the launches are recorded whatever the cases' verdicts (rc, in the file)


class LaunchRecorder:
    """Patches ``InterpretedFunction.run`` (restored by :meth:`close`) to record each launch's specialization as
    Triton's CUDA launcher would compute it (:class:`specialization.Specializer`)."""

    def __init__(self):
        from triton.runtime.interpreter import InterpretedFunction

        self._specializer = Specializer()
        self.records: Dict[str, dict] = {}
        self._cls = InterpretedFunction
        self._orig = InterpretedFunction.run
        recorder = self

        def run(fn_self, *args, grid, warmup, **kwargs):
            recorder.record(fn_self, args, kwargs)
            return recorder._orig(fn_self, *args, grid=grid, warmup=warmup, **kwargs)

        InterpretedFunction.run = run

    def close(self):
        self._cls.run = self._orig

    def record(self, interp_fn, args, kwargs):
        rec = self._specializer.record(interp_fn, args, kwargs)
        key = rec["key"]
        if key in self.records:
            self.records[key]["launches"] += 1
        else:
            rec["launches"] = 1
            self.records[key] = rec



def compile_main(launches_json: str, out_dir: str, targets: Sequence[str]) -> int:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("compile needs a process without TRITON_INTERPRET")
    os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")  # as the GPU leg
    import warnings

    import triton
    from triton._C.libtriton import llvm
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend

    warnings.filterwarnings("ignore", message="Triton is not supported on current platform")
    import fla.ops  # noqa: F401

    data = read_launches(Path(launches_json))
    out = Path(out_dir)
    index = []
    for tname in targets:
        cc = TARGETS[tname]
        target = GPUTarget("cuda", cc, 32)
        backend = make_backend(target)
        (out / tname).mkdir(parents=True, exist_ok=True)
        for rec in data["specializations"]:
            entry = {"key": rec["key"], "module": rec["module"], "qualname": rec["qualname"], "target": tname}
            stem = out / tname / f"{rec['qualname']}-{rec['key']}"
            t0 = time.time()
            try:
                kernel = compile_record(rec, cc)
                opt = backend.parse_options(dict(rec["options"]))
                llir, ptx = kernel.asm["llir"], kernel.asm["ptx"]
                llvm.init_targets()  # a kernel served from Triton's cache has not initialised LLVM's targets
                nofusion = backend.make_ptx(llir, {}, dataclasses.replace(opt, enable_fp_fusion=False), cc)
                stem.with_suffix(".ttir").write_text(kernel.asm["ttir"])
                stem.with_suffix(".ttgir").write_text(kernel.asm["ttgir"])
                stem.with_suffix(".ptx").write_text(ptx)
                stem.with_suffix(".nofusion.ptx").write_text(nofusion)
                entry.update(files=stem.name, enable_fp_fusion=opt.enable_fp_fusion, num_warps=opt.num_warps,
                             num_stages=opt.num_stages, error=None)
            except Exception as exc:  # noqa: BLE001 - one kernel's failure is its row, the sweep goes on
                entry.update(files=None, error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            entry["seconds"] = round(time.time() - t0, 3)
            index.append(entry)
    (out / "index.json").write_text(json.dumps({"triton": triton.__version__, "kernels": index}, indent=1))
    return 0



def _run_step(argv: List[str], env: dict, what: str, log: Path) -> None:
    with open(log, "w") as fh:
        proc = subprocess.run([sys.executable, "-m", "harness.emulation.ptx.capture", *argv], env=env, stdout=fh,
                              stderr=subprocess.STDOUT, cwd=str(Path(__file__).resolve().parents[3]))
    if proc.returncode != 0:
        tail = log.read_text().strip().splitlines()[-1:] or ["(no output)"]
        raise RuntimeError(f"{what} failed (exit {proc.returncode}; log {log}): {tail[0]}")


def capture_launches(command: List[str], out_json: Path, log: Path, **said) -> dict:
    """The launches of ``command`` (``[python, "-m", MODULE, *ARGS]``: the leg's run, as the caller writes it) run
    under the interpreter in a process of its own, with no cache (every launch happens), into ``out_json``;
    ``said``: facts the file keeps beside them (the leg and the selection the sweep keys)."""
    if command[1:2] != ["-m"] or len(command) < 3:
        raise RuntimeError(f"capture: {command[:3]} is not a `python -m MODULE ...` command")
    env = dict(os.environ)
    env["PARITY_CACHE_DIR"] = ""  # no cache serves (or receives) a case: every launch happens
    env.pop("TRITON_INTERPRET", None)
    _run_step(["capture", str(out_json), "--", *command[2:]], env, "capture (the GPU leg under the interpreter)", log)
    data = {**json.loads(out_json.read_text()), **said}
    out_json.write_text(json.dumps(data, indent=1))
    return data


def read_launches(path: Path) -> dict:
    """A capture's launches.json (or .json.gz, as reports/ptx keeps it)."""
    if path.suffix == ".gz":
        import gzip

        return json.loads(gzip.decompress(path.read_bytes()))
    return json.loads(path.read_text())


def compile_kernels(launches: Path, out_dir: Path, targets: Sequence[str], log: Path) -> dict:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    with tempfile.TemporaryDirectory(prefix="parity-ptx-triton-cache-") as cache:
        env["TRITON_CACHE_DIR"] = cache  # every kernel compiled here and now (and timed), none served from a cache
        _run_step(["compile", str(launches), str(out_dir), ",".join(targets)], env, "compile", log)
    return json.loads((out_dir / "index.json").read_text())


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["capture"] and len(argv) >= 4 and argv[2] == "--":
        return capture_main(argv[1], argv[3:])
    if argv[:1] == ["compile"] and len(argv) == 4:
        return compile_main(argv[1], argv[2], argv[3].split(","))
    print("python -m harness.emulation.ptx.capture runs a sweep's capture and compile steps; the command is "
          "`parity ptx`", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
