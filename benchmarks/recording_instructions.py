"""Instructions recording costs, part by part, in-process under callgrind: python -m benchmarks.recording_instructions.

    python -m benchmarks.recording_instructions [--batch 200] [--batches 20] [--calls 2000] [--keep DIR]

Builds the demo home (a temporary one unless --home is given; SQLite store), makes --calls saved-query calls of
the demo's `customer` query (scoped key, one row) with the observer's run queue captured, so the run records
are real ones, then runs itself again under valgrind's callgrind with instrumentation off and switches it on around
each part alone, main thread only (the writer threads never run a part here):

  history   History._write (the writer thread's work: names, sampling, rows, SqliteStore.add_runs with its
            trimming) over --batches batches of --batch records, after as many unmeasured batches, so every
            version is already at its history limit as in a long-running worker: instructions per run
  logs      LogWriter._write of one request line per call (the default: QAG_LOG_REQUESTS on, statements off):
            instructions per line
  calls     what a request thread spends recording one call: Observer.request + begin + done (metrics, the
            history writer's put, the log line's put), the writers' threads kept from running: per call, the
            probe's own interpreted loop included

A server worker's figure (benchmarks.server_instructions) has these in it, but under valgrind its timer-driven
writers flush far more often per request than on real hardware; these figures are per run, line or call alone,
and repeat to within about 1%.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

from .call_cost import UNDER_CALLGRIND, rerun_under_callgrind

PARTS = ("history", "logs", "calls")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.recording_instructions", description=__doc__.splitlines()[0])
    p.add_argument("--home", help="demo home to use (default: a fresh temporary one)")
    p.add_argument("--calls", type=int, default=2000, help="real calls whose run records are captured (default 2000)")
    p.add_argument("--batch", type=int, default=200, help="records per history batch (default 200)")
    p.add_argument("--batches", type=int, default=20, help="counted history batches (default 20)")
    p.add_argument("--keep", metavar="DIR", help="keep each part's callgrind profile there (for callgrind_annotate)")
    return p


def _control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(os.getpid())], check=True, capture_output=True)


def _counted(args) -> None:
    """Inside callgrind: each part with instrumentation on, then a dump named after it."""
    from benchmarks.wsgi_call import CALLS, wsgi_get
    from qag import demo
    from qag.app import create_app
    from qag.settings import load
    from qag.testing import Client

    home = args.home or tempfile.mkdtemp(prefix="qag-bench-")
    keys = demo.prepare_home(home, False, Client(load({"QAG_HOME": home})).manage)
    app = create_app(load({"QAG_HOME": home, "QAG_API_KEY": keys["admin_key"]}))
    observer = app.observe
    observer.logs.install(open(os.devnull, "w"))
    path, make_query, key_name = CALLS["customer (1 row, scoped key)"]
    # The run records the calls queue, kept from the writer thread by its flush lock (taken here, never waited
    # for by put) and taken off its queue before it can write them.
    history_writer = observer.history.writer
    with history_writer._flush_lock:
        for i in range(args.calls):
            wsgi_get(app, path, make_query(i), keys[key_name])
        captured = list(history_writer._queue)
        history_writer._queue.clear()
    observer.logs.buffer.flush()
    # Batches cycle through the records the calls made (the store needs no record to be new).
    batches = [[captured[(b * args.batch + i) % len(captured)] for i in range(args.batch)]
               for b in range(2 * args.batches)]
    for batch in batches[:args.batches]:
        observer.history._write(batch, os.urandom(12).hex())
    _control("-i", "on")
    for batch in batches[args.batches:]:
        observer.history._write(batch, os.urandom(12).hex())
    _control("-i", "off")
    _control("-d", "history")

    now = time.time()
    lines = [("req", now + i * 0.0003, "0123456789ab", "scoped", "GET", path, 200, 0.3 + i % 7 * 0.01, None)
             for i in range(args.calls)]
    observer.logs._write(lines[:200], os.urandom(12).hex())
    _control("-i", "on")
    observer.logs._write(lines, os.urandom(12).hex())
    _control("-i", "off")
    _control("-d", "logs")

    # The request thread's part: the writers must not run meanwhile (their work is counted above), so their
    # threads are held by their flush locks (taken here, never waited for by put) and the queues are emptied
    # between rounds unmeasured.
    log_writer = observer.logs.buffer
    plans = [record[0] for record in captured]
    rounds = 4
    per_round = min(len(plans), 500)
    for r in range(rounds + 1):
        with history_writer._flush_lock, log_writer._flush_lock:
            if r:
                _control("-i", "on")
            for i in range(per_round):
                plan = plans[i]
                observer.begin()
                at = time.time()
                observer.done(plan, at, 1, 0.2, 0.00002)
                observer.request("GET", "api.run_named_query", 200, "scoped", 0.0004, plan.request_id, path, at)
            if r:
                _control("-i", "off")
            history_writer._queue.clear()
            log_writer._queue.clear()
    _control("-d", "calls")
    app.close()
    if not args.home:
        shutil.rmtree(home, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    if os.environ.get(UNDER_CALLGRIND):
        _counted(args)
        return 0
    out_dir = tempfile.mkdtemp(prefix="qag-callgrind-")
    try:
        out = rerun_under_callgrind("benchmarks.recording_instructions", argv, out_dir)
        units = {"history": args.batch * args.batches, "logs": args.calls, "calls": 4 * min(args.calls, 500)}
        figures = {}
        for number, part in enumerate(PARTS, 1):
            profile = glob.glob(f"{out}.{number}-01") or glob.glob(f"{out}*.{number}-01")
            with open(profile[0]) as fh:
                total = next(int(line.split()[1]) for line in fh if line.startswith("totals:"))
            figures[part] = total / units[part]
            if args.keep:
                os.makedirs(args.keep, exist_ok=True)
                shutil.copyfile(profile[0], os.path.join(args.keep, f"callgrind.{part}"))
        from qag import _speedups
        print(f"recording, instructions (main thread; speedups {_speedups.mode()}): "
              f"history writer {figures['history']:.0f} per run (batches of {args.batch}), "
              f"log writer {figures['logs']:.0f} per line, request thread {figures['calls']:.0f} per call")
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
