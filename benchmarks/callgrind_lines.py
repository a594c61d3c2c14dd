"""Instructions by source line of a compiled qag module, from a callgrind profile (server_instructions --keep).

    python -m benchmarks.callgrind_lines DIR/callgrind.qag_workers_1 qag/api/run.py --per 2000 [--top 40]

Cython writes each statement's C code after a comment naming its line of the .py or .pyx source
(`/* "qag/api/run.py":550`), and the build keeps debug information, so callgrind_annotate can give every line of
the generated C file its instructions, inclusive of the calls made from it. Summed by those comments, they say
what each source line costs, what it calls included: the finer view that a profile by C function can't give of
code where most instructions are the interpreter's own helpers (attribute and dict lookups, calls) run on a
line's behalf. `--per` divides by the requests the profile holds (server_instructions' `--requests`).

Read the figures with two caveats. A line's figure includes what it calls, so the lines of one function do not
add up to its total. And the wrappers Python calls go through (argument parsing, then the whole call) follow
whichever marker Cython wrote last, often another function's `def` or `class` line: such lines are left out
unless `--with-defs` is given.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build", "cython")

_SECTION = re.compile(r"^-- (?:Auto|User)-annotated source: (.*)$")
_MARKER = re.compile(r'/\* "(qag/[\w/]+\.pyx?)":(\d+)')
_COUNT = re.compile(r"^\s*([\d,]+) ")


def c_file(source: str) -> str:
    """The generated C file of a compiled module's source: qag/api/run.py -> build/cython/qag/api/run.c."""
    return os.path.join(BUILD, os.path.splitext(source)[0] + ".c")


def _names(c_path: str, root: str = ROOT) -> set[str]:
    """The names a profile may record the C file under: absolute, or relative to the checkout when the build ran
    from it (an in-place rebuild)."""
    return {c_path, os.path.relpath(c_path, root)}


def by_line(annotated: str, c_path: str, root: str = ROOT) -> collections.Counter:
    """(source path, line) -> instructions, from callgrind_annotate's output for the C file `c_path`: each
    counted C line goes to the source line of the last marker comment above it."""
    names = _names(c_path, root)
    counts: collections.Counter = collections.Counter()
    inside = False
    current = None
    for line in annotated.splitlines():
        section = _SECTION.match(line)
        if section:
            inside = section.group(1) in names
            current = None
            continue
        if not inside:
            continue
        marker = _MARKER.search(line)
        if marker:
            current = (marker.group(1), int(marker.group(2)))
            continue
        count = _COUNT.match(line)
        if count and current is not None:
            counts[current] += int(count.group(1).replace(",", ""))
    return counts


def annotate(profile: str, c_path: str) -> str:
    """callgrind_annotate's inclusive per-line view of `c_path`, with the whole file as context (so that no marker
    comment is left out between two counted lines)."""
    tool = shutil.which("callgrind_annotate")
    if tool is None:
        raise SystemExit("callgrind_annotate is not installed (it comes with valgrind)")
    done = subprocess.run([tool, "--inclusive=yes", "--auto=no", "--context=10000000", profile,
                           *sorted(_names(c_path))], capture_output=True, text=True, check=True)
    return done.stdout


_DEFINITION = re.compile(r"(async\s+)?def\s|class\s|@|__slots__\b")


def report(counts: collections.Counter, per: int, top: int, root: str = ROOT, with_defs: bool = False) -> str:
    """The `top` lines by instructions (divided by `per`), each with its source text read from under `root`;
    definition lines (where wrappers land) only `with_defs`."""
    lines = []
    sources: dict[str, list[str]] = {}
    for (path, number), instructions in counts.most_common():
        if len(lines) == top:
            break
        if path not in sources:
            with open(os.path.join(root, path), encoding="utf-8") as fh:
                sources[path] = fh.read().splitlines()
        text = sources[path][number - 1].strip() if number <= len(sources[path]) else ""
        if not with_defs and _DEFINITION.match(text):
            continue
        lines.append(f"{instructions / per:10,.0f}  {path}:{number}  {text[:110]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.callgrind_lines", description=__doc__.splitlines()[0])
    p.add_argument("profile", help="a callgrind output file (server_instructions --keep DIR writes them there)")
    p.add_argument("source", nargs="+", help="compiled modules' sources, as qag/api/run.py")
    p.add_argument("--per", type=int, default=1, help="divide by this many requests (default 1)")
    p.add_argument("--top", type=int, default=40, help="lines shown per module (default 40)")
    p.add_argument("--with-defs", action="store_true", help="show def/class lines too (they hold wrappers' costs)")
    args = p.parse_args(argv)
    for source in args.source:
        path = c_file(source)
        if not os.path.exists(path):
            raise SystemExit(f"{path}: no generated C file (is {source} compiled, and built here?)")
        print(f"== {source}: instructions per {'request' if args.per > 1 else 'profile'}, inclusive")
        print(report(by_line(annotate(args.profile, path), path), args.per, args.top, with_defs=args.with_defs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
