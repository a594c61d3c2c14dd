"""`python -m build_backend inplace`: compile qag/_speedups next to its sources (for a source checkout)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from . import speedups

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m build_backend",
                                     description="Build helpers for qag's compiled speedups.")
    commands = parser.add_subparsers(dest="command", required=True)
    inplace = commands.add_parser("inplace", help="build qag/_speedups/*.so beside the sources "
                                                  "(needs setuptools and Cython>=3 in this Python)")
    inplace.add_argument("--speedups", default=None,
                         help="auto, require or off (default: $QAG_BUILD_SPEEDUPS, else auto)")
    args = parser.parse_args(argv)
    mode = speedups.resolve_mode(args.speedups, "--speedups")
    env = dict(os.environ, **{speedups.ENV: mode})
    return subprocess.call([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main())
