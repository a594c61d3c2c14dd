"""qag built from git refs, each in its own virtual environment, for `run.py --refs A,B` side by side.

The ref's tree is exported with `git archive` (no worktree, nothing changes in the checkout) and installed with
pip into `<QAG_BENCH_VENVS>/qag-<sha12>`, compiling its speedups as its own build backend decides. Built once
per commit and reused.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

from .targets import REPO, VENVS


def resolve(ref: str) -> str:
    return subprocess.run(["git", "-C", REPO, "rev-parse", "--verify", f"{ref}^{{commit}}"], capture_output=True,
                          text=True, check=True).stdout.strip()


def venv_python(ref: str) -> str:
    """The python of a venv holding qag as of `ref` (built on first use)."""
    sha = resolve(ref)
    venv = os.path.join(VENVS, f"qag-{sha[:12]}")
    python = os.path.join(venv, "bin", "python")
    marker = os.path.join(venv, ".qag-installed")
    if os.path.exists(marker):
        return python
    src = tempfile.mkdtemp(prefix=f"qag-src-{sha[:12]}-")
    try:
        archive = subprocess.run(["git", "-C", REPO, "archive", sha], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", src], input=archive, check=True)
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([shutil.which("python3") or sys.executable, "-m", "venv", venv], check=True)
        print(f"installing qag@{ref} ({sha[:12]}) into {venv}", file=sys.stderr)
        subprocess.run([python, "-m", "pip", "install", "-q", f"{src}[mysql,postgres]"], check=True)
    finally:
        shutil.rmtree(src, ignore_errors=True)
    open(marker, "w").close()
    return python
