"""Which code produced a result: the commit a command's JSON records (demo, benchmarks)."""

from __future__ import annotations

import subprocess
from pathlib import Path

__all__ = ["source_commit"]


def source_commit() -> str | None:
    """The checkout's commit (with ``+`` when ``src/`` has uncommitted changes), None outside a git checkout."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        # the package's own files only: make demo's earlier results (benchmarks/results) are not the code
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ":/src"], cwd=here,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("+" if dirty else "")
