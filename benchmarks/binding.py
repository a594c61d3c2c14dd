"""Would compiling parameter binding pay? Times qag/sql/params.py and prepare.py as they are (pure) against the same
files compiled with Cython in a scratch folder (python -m benchmarks.binding; needs `pip install cython`).

The issue's rule for qag/_speedups: a module that is not at least 2x faster than its pure twin on its
benchmark is not compiled. Binding is two steps on every call - Resolver.resolve (declared rules: coerce and
check each value) and render (the statement's arguments in placeholder order, LIMIT/OFFSET window) - timed on
the same inputs, in interleaved rounds, median with min-max.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import timeit

# The pure twins as they are (the request path is compiled in place in a full build, and picked at import).
os.environ["QAG_SPEEDUPS"] = "off"
from qag.sql import params as pure_params  # noqa: E402
from qag.sql import prepare as pure_prepare  # noqa: E402

RULES = {"id": {"type": "int", "required": True},
         "status": {"type": "string", "enum": ["open", "shipped"], "default": "open"},
         "since": {"type": "number", "min": 0}}
VALUES = {"id": "42", "status": "shipped", "since": "1.5"}   # as they arrive in a query string
SQL = "SELECT * FROM orders WHERE customer_id = :id AND status = :status AND total > :since"


def compile_copies(folder: str) -> tuple[object, object]:
    """params.py and prepare.py compiled by Cython as top-level modules cparams/cprepare in `folder`."""
    for name in ("params", "prepare"):
        # The source beside the module: in a compiled build the module itself is the extension.
        source = os.path.join(os.path.dirname(pure_params.__file__), name + ".py")
        with open(source, encoding="utf-8") as fh:
            text = fh.read()
        # Relative imports become absolute ones, so the copies import qag's other modules, not themselves.
        text = re.sub(r"^from \.(\w*) import", lambda m: f"from qag.sql{'.' + m.group(1) if m.group(1) else ''} import",
                      text, flags=re.MULTILINE)
        with open(os.path.join(folder, f"c{name}.py"), "w", encoding="utf-8") as fh:
            fh.write(text)
    subprocess.run([sys.executable, "-m", "cython", "-3", "cparams.py", "cprepare.py"], cwd=folder, check=True,
                   capture_output=True)  # its warnings about annotations it ignores are noise here
    import sysconfig
    include = sysconfig.get_paths()["include"]
    modules = []
    for name in ("cparams", "cprepare"):
        target = os.path.join(folder, name + sysconfig.get_config_var("EXT_SUFFIX"))
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", f"-I{include}", f"{name}.c", "-o", target],
                       cwd=folder, check=True)
        spec = importlib.util.spec_from_file_location(name, target)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        modules.append(module)
    return modules[0], modules[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--number", type=int, default=100_000)
    args = parser.parse_args(argv)
    if importlib.util.find_spec("Cython") is None:
        print("Cython is not installed: pip install cython", file=sys.stderr)
        return 2
    folder = tempfile.mkdtemp(prefix="qag-binding-")
    try:
        cparams, cprepare = compile_copies(folder)
        steps = {}
        for kind, params, prepare in (("pure", pure_params, pure_prepare), ("compiled", cparams, cprepare)):
            resolver = params.compile_rules(RULES, None)
            prepared = prepare.prepare(SQL, "mysql")
            resolved = resolver.resolve(VALUES)
            steps[kind] = {"resolve": lambda r=resolver: r.resolve(VALUES),
                           "render": lambda p=prepared, v=resolved, m=prepare: m.render(p, v, "format", 11, 0)}
        assert steps["pure"]["render"]() == steps["compiled"]["render"](), "the compiled copy must bind the same"
        times = {(kind, step): [] for kind in steps for step in ("resolve", "render", "both")}
        for round_ in range(args.rounds):
            order = ("pure", "compiled") if round_ % 2 == 0 else ("compiled", "pure")
            for kind in order:
                total = 0.0
                for step in ("resolve", "render"):
                    micro = timeit.timeit(steps[kind][step], number=args.number) / args.number * 1e6
                    times[(kind, step)].append(micro)
                    total += micro
                times[(kind, "both")].append(total)
        print(f"binding, {args.rounds} interleaved rounds of {args.number} calls, µs per call: median (min-max)")
        print(f"{'step':8s} {'pure':>22s} {'compiled':>22s} {'speed-up':>9s}")
        for step in ("resolve", "render", "both"):
            cells = []
            for kind in ("pure", "compiled"):
                values = times[(kind, step)]
                cells.append(f"{statistics.median(values):6.2f} ({min(values):.2f}-{max(values):.2f})")
            ratio = statistics.median(times[("pure", step)]) / statistics.median(times[("compiled", step)])
            print(f"{step:8s} {cells[0]:>22s} {cells[1]:>22s} {ratio:8.2f}x")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
