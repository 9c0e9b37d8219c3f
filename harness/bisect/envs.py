"""One cached, isolated environment per version: the package installed with uv into a folder of its own
(``uv pip install --no-deps --target``), which a version's run puts first on ``PYTHONPATH`` over this stack. So
the library's own pins (a second jax, vLLM) never replace the stack every version is measured on, and a version
is installed once: a later bisection of the same package finds its folder ready."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from .versions import Version

READY = ".parity-installed"  # written last: a folder without it is an install that did not finish


class InstallFailed(Exception):
    """A version that did not install; its message is the installer's last line."""


class RunFailed(Exception):
    """A version's run that ended without rows (its message: how, and its last line); not stored, so the next
    bisection runs it again."""


def default_uv() -> str:
    """uv on PATH, else the one beside this Python, else ``python -m uv``'s module."""
    found = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    return found if Path(found).exists() else ""


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no message)"


class UvInstaller:
    """Installs versions into ``cache/<package or checkout>/<version>/`` with ``uv`` (``--no-deps``: only the
    package's own files). ``python``: the interpreter whose tags the wheel must fit (this one)."""

    def __init__(self, cache: Path, uv: str | None = None, python: str = sys.executable):
        self.cache, self.python = Path(cache), python
        self.uv = uv or default_uv()

    def folder(self, package: str, version: Version) -> Path:
        return self.cache / package / version.name

    def install(self, package: str, version: Version) -> Path:
        """The version's folder, installing it first unless an earlier install finished (InstallFailed with the
        installer's last line otherwise)."""
        target = self.folder(package, version)
        if (target / READY).exists():
            return target
        if not self.uv:
            raise InstallFailed("uv not found: pip install uv, or put it on PATH")
        shutil.rmtree(target, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{version.name}-") as scratch:
            source = version.install
            if version.checkout:  # a commit: its tree, exported, installed as a local project
                source = str(Path(scratch) / "src")
                tar = Path(scratch) / "src.tar"
                archive = subprocess.run(["git", "-C", str(version.checkout), "archive", "--format=tar", "-o",
                                          str(tar), version.install], capture_output=True, text=True)
                if archive.returncode:
                    raise InstallFailed(_last_line(archive.stderr))
                with tarfile.open(tar) as exported:  # no shell: paths and revisions are arguments, not words
                    exported.extractall(source, filter="data")
            staged = Path(scratch) / "site"
            env = dict(os.environ, UV_CACHE_DIR=str(self.cache / ".uv-cache"))
            done = subprocess.run([self.uv, "pip", "install", "--no-deps", "--python", self.python, "--target",
                                   str(staged), source], capture_output=True, text=True, env=env)
            if done.returncode:
                raise InstallFailed(_last_line(done.stderr or done.stdout))
            (staged / READY).write_text(f"{source}\n")
            staged.rename(target)
        return target


class LegInProcess:
    """``measure`` of :class:`harness.bisect.history.History`: ``parity run`` of the leg ``recipe`` describes
    (:meth:`harness.run.recipe.LegRecipe.command_line`) over the cases, in a process of its own with the version's
    folder first on ``PYTHONPATH`` (None: this stack alone), into a scratch folder kept between runs (``--resume``
    continues a run cut short). A run that makes no result file raises :class:`RunFailed`."""

    def __init__(self, recipe, python: str = sys.executable):
        self.recipe, self.python = recipe, python

    @property
    def leg(self) -> str:
        return self.recipe.name

    def __call__(self, site: Path | None, case_ids: list[str], scratch: Path):
        from harness.core.results import read_results

        scratch.mkdir(parents=True, exist_ok=True)
        root = Path(__file__).resolve().parents[2]  # this project, ahead of any installed copy of it
        paths = [str(site)] if site else []
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths + [str(root), os.environ.get("PYTHONPATH", "")]))
        resume = any(scratch.glob("*.partial.csv"))  # a run cut short: continue it
        command = self.recipe.command_line(self.python, case_ids, scratch, jobs=1, resume=resume)
        before = {p: p.stat().st_mtime_ns for p in scratch.glob("*.csv")}
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        made = [p for p in scratch.glob("*.csv") if "partial" not in p.name and before.get(p) != p.stat().st_mtime_ns]
        if done.returncode in (0, 1, 4) and len(made) == 1:  # 1: failing rows; 4: a case's process died (its rows say)
            rows = read_results(made[0])
            made[0].rename(made[0].with_suffix(".taken"))  # the next run of other cases writes a file of its own
            return rows
        raise RunFailed(f"parity run exited {done.returncode} without rows: {_last_line(done.stderr or done.stdout)}")
