"""No source file is hidden from commits by a .gitignore pattern.

A pattern meant for build outputs (``dist/``, ``build/``) also matches a package of that name
anywhere below the root; the module then works in the author's checkout and is missing from every
clone. This check runs in the checkout that is about to be committed.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_no_source_file_is_ignored_by_git() -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (an unpacked sdist): nothing can be left out of a commit here")
    sources = [p.relative_to(ROOT).as_posix() for top in ("src", "triton_kernels", "tests", "benchmarks", "recipes")
               for p in (ROOT / top).rglob("*") if p.suffix in (".py", ".json", ".yaml", ".md") and p.is_file()
               and "__pycache__" not in p.parts and not any(part.endswith(".egg-info") for part in p.parts)]
    assert sources, "no source files found"
    # check-ignore exits 1 when nothing is ignored: the output, not the code, is the answer
    out = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], check=False, cwd=ROOT, input="\n".join(sources),
                         capture_output=True, text=True, timeout=60)
    ignored = out.stdout.split()
    assert not ignored, f"git ignores these source files, so no commit holds them: {ignored[:10]}; fix .gitignore"
