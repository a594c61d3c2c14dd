"""Test helper: a process started with this folder on PYTHONPATH notes which process first imports a module.

Python imports `sitecustomize` at startup; this one adds an audit hook that appends `<pid> <parent pid> <module>`
to the file named by QAG_TEST_IMPORT_LOG for every module whose name starts with one of the comma-separated
QAG_TEST_IMPORT_PREFIXES. The hook survives fork, so a gunicorn master's workers log their own imports: a test
can tell an import in the master from one in a worker (tests/integration/test_tracing.py).
"""

import os
import sys

_LOG = os.environ.get("QAG_TEST_IMPORT_LOG")
_PREFIXES = tuple(p for p in os.environ.get("QAG_TEST_IMPORT_PREFIXES", "").split(",") if p)


def _note(event: str, args: tuple) -> None:
    if event == "import" and isinstance(args[0], str) and args[0].startswith(_PREFIXES):
        with open(_LOG, "a", encoding="utf-8") as out:   # one short line per write: appends don't interleave
            out.write(f"{os.getpid()} {os.getppid()} {args[0]}\n")


if _LOG and _PREFIXES:
    sys.addaudithook(_note)
