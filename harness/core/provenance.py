"""Where a row was made: this checkout's commit (the rows' ``git_commit``; the PTX record's and the benchmarks'
too)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""This repository's root (a checkout, or an installed copy without one)."""


def git_commit(short: bool = True, root: Path = ROOT) -> str | None:
    """``git rev-parse HEAD`` of ``root``: 12 hex digits (``short``) or all 40; None where it is not a git checkout
    or git is absent."""
    try:
        out = subprocess.run(["git", "rev-parse", *(["--short=12"] if short else []), "HEAD"], cwd=root,
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None
