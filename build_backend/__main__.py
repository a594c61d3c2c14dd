"""`python -m build_backend inplace|demo`: compile the speedups beside their sources; run `make demo`'s server."""

from __future__ import annotations

import argparse
import os
import sys

from . import demo, inplace, speedups


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m build_backend",
                                     description="Build helpers for qag's compiled speedups.")
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("inplace", help="build the compiled modules beside their sources, what is missing "
                                                "or stale only (needs setuptools and Cython>=3 in this Python); "
                                                "one line per module, the tools' output in build/speedups.log")
    build.add_argument("--speedups", default=None,
                       help="auto, require or off (default: $QAG_BUILD_SPEEDUPS, else auto)")
    build.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1,
                       help="modules compiled at a time (default: every core, %(default)s here)")
    serve = commands.add_parser("demo", help="run COMMAND (the demo server) at once on the pure-Python twins "
                                             "while the missing or stale compiled modules build in the background, "
                                             "then restart it on them (QAG_SPEEDUPS=require: build first; off: "
                                             "no build)")
    serve.add_argument("server", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return demo.main(args.server[1:] if args.server[:1] == ["--"] else args.server)
    mode = speedups.resolve_mode(args.speedups, "--speedups")
    if mode == "off":
        return 0
    return inplace.run(mode, max(1, args.jobs))


if __name__ == "__main__":
    sys.exit(main())
