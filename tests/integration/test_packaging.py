"""The release path: sdist → wheel built from it → clean virtual environment → a working `qag` with compiled code."""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import venv

import pytest

from qag.api import docs
from tests.server import check_demo

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(*args, **kw):
    result = subprocess.run(args, capture_output=True, text=True, timeout=600, **kw)
    assert result.returncode == 0, f"{args}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.mark.e2e
@pytest.mark.skipif(os.environ.get("QAG_TEST_INSTALLED") == "1",
                    reason="builds from the source tree; `make wheel` runs the suite against an installed wheel")
def test_wheel_from_sdist_installs_and_runs_compiled(tmp_path):
    dist = tmp_path / "dist"
    # python -m build makes the sdist, then builds the wheel from that sdist (not from the tree).
    built = run(sys.executable, "-m", "build", "--outdir", str(dist), "-C", "speedups=require", ROOT)
    # The wheel's build says what it does, a line per module compiled (pip shows these with -v).
    said = built.stdout + built.stderr
    plan = re.search(r"qag build: compiling (\d+) of (\d+) modules, (\d+) at a time", said)
    assert plan and plan.group(1) == plan.group(2), said[-3000:]
    assert int(plan.group(3)) == min(os.cpu_count() or 1, int(plan.group(1)))
    assert len(re.findall(r"qag build: \[ *\d+/%s\] qag\.\S+ \(" % plan.group(1), said)) == int(plan.group(1))
    wheel = glob.glob(str(dist / "qag-*.whl"))
    assert len(wheel) == 1 and "none-any" not in wheel[0], wheel
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")
    run(python, "-m", "pip", "install", "-q", wheel[0])
    clean_env = {k: v for k, v in os.environ.items() if not k.startswith(("QAG_", "QUERYAPIGATE_", "PYTHON"))}
    version = run(str(env_dir / "bin" / "qag"), "version", env={**clean_env, "QAG_SPEEDUPS": "require"},
                  cwd=str(tmp_path))
    assert "rowjson=compiled" in version.stdout
    # The installed package, not the source tree, answered.
    where = run(python, "-c", "import qag, qag._speedups._rowjson as r; print(qag.__file__, r.__file__)",
                cwd=str(tmp_path), env=clean_env)
    assert str(env_dir) in where.stdout and ".so" in where.stdout
    # /docs is served from the package: every file the page loads, and Swagger UI's licence, are in the wheel.
    assets = run(python, "-c", "from qag.api import docs; s = docs.STATIC; print(sum(1 for r, _ in docs.FILES.values()"
                 " if (s / r).stat().st_size), (s / 'swagger_ui' / 'LICENSE').is_file(), s)",
                 cwd=str(tmp_path), env=clean_env)
    assert assets.stdout.split()[:2] == [str(len(docs.FILES)), "True"] and str(env_dir) in assets.stdout, assets.stdout
    check_demo([str(env_dir / "bin" / "qag")], str(tmp_path / "demo"))
