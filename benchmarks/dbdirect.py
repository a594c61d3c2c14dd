"""Build (once, cached by source hash) and run the direct database client, benchmarks/dbdirect.c."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "dbdirect.c")
BUILD = os.path.join(HERE, "build")


def _flags(package_names: tuple[str, ...]) -> list[str]:
    for name in package_names:
        out = subprocess.run(["pkg-config", "--cflags", "--libs", name], capture_output=True, text=True)
        if out.returncode == 0:
            return out.stdout.split()
    raise RuntimeError(f"none of the pkg-config packages {package_names} is installed "
                       "(apt-get install libmariadb-dev libpq-dev)")


def build() -> str:
    """The path of the compiled client; compiles it when the source changed."""
    with open(SOURCE, "rb") as fh:
        digest = hashlib.sha256(fh.read()).hexdigest()[:12]
    binary = os.path.join(BUILD, f"dbdirect-{digest}")
    if os.path.exists(binary):
        return binary
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        raise RuntimeError("the direct database client needs a C compiler (apt-get install gcc)")
    os.makedirs(BUILD, exist_ok=True)
    flags = _flags(("libmariadb", "mariadb", "mysqlclient")) + _flags(("libpq",))
    cmd = [shutil.which("cc") or "gcc", "-O2", "-o", binary + ".tmp", SOURCE, *flags, "-lpthread", "-lm"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError("building dbdirect failed:\n" + out.stderr)
    os.replace(binary + ".tmp", binary)
    return binary


def command(binary: str, config_path: str, dsn: dict, threads: int, seconds: float, distribution: str) -> list[str]:
    return [binary, config_path, dsn["kind"], dsn["host"], str(dsn["port"]), dsn["user"], dsn["password"],
            dsn["database"], str(threads), str(seconds), distribution]
