"""How long a request thread waits for the interpreter lock while the history writer writes a batch.

    python -m benchmarks.writer_wait [--ref REF ...] [--rounds 5] [--batches 20] [--batch 500] [--pin 0]

In a fresh child process per target and round (targets interleaved): the demo home (SQLite store), --batch real
run records captured from calls of the demo's `customer` query (the writer thread held off), then --batches
writes of that batch by `History._write` on the main thread, while a second thread, standing in for a request
thread, sleeps 0.2 ms in a loop and notes how late each of its wake-ups takes the lock. Per batch: its write's wall
time and the other thread's longest wait (the whole write when it never got in). Prints, per target, the median
[min-max] over rounds of each round's median. Both threads on one core (--pin, default 0), as in the benchmarks'
pinned worker; `--ref` adds qag as of a git ref (its own venv, benchmarks/refs.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from .targets import REPO

_TICK = 0.0002      # the stand-in request thread's sleep


def _child(batch: int, batches: int) -> dict:
    """One round in this process (whichever qag it imports): the medians of write time and worst wait, in ms."""
    from benchmarks.wsgi_call import CALLS, wsgi_get
    from qag import demo
    from qag.app import create_app
    from qag.settings import load
    from qag.testing import Client

    home = tempfile.mkdtemp(prefix="qag-bench-")
    keys = demo.prepare_home(home, False, Client(load({"QAG_HOME": home})).manage)
    app = create_app(load({"QAG_HOME": home, "QAG_API_KEY": keys["admin_key"]}))
    path, make_query, key_name = CALLS["customer (1 row, scoped key)"]
    writer = app.observe.history.writer
    with writer._flush_lock:       # the records stay queued (the writer thread waits for this lock): taken below
        for i in range(batch):
            wsgi_get(app, path, make_query(i), keys[key_name])
        records = list(writer._queue)
        writer._queue.clear()
    late: list[float] = []
    stop = threading.Event()

    def request_thread() -> None:
        while not stop.is_set():
            start = time.perf_counter()
            time.sleep(_TICK)
            late.append(time.perf_counter() - start - _TICK)

    thread = threading.Thread(target=request_thread, daemon=True)
    thread.start()
    writes, waits = [], []
    for _ in range(batches):
        time.sleep(0.01)
        late.clear()
        start = time.perf_counter()
        app.observe.history._write(records, os.urandom(12).hex())
        took = time.perf_counter() - start
        writes.append(took)
        waits.append(max(late) if late else took)   # never got in: it waited the whole write
    stop.set()
    thread.join()
    app.close()
    return {"write_ms": statistics.median(writes) * 1e3, "wait_ms": statistics.median(waits) * 1e3}


def _run_child(python: str, cwd: str, args, env: dict) -> dict:
    cmd = [python, "-m", "benchmarks.writer_wait", "--child", "--batch", str(args.batch), "--batches",
           str(args.batches)]
    if args.pin:
        cmd = ["taskset", "-c", args.pin, *cmd]
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.writer_wait", description=__doc__.splitlines()[0])
    p.add_argument("--ref", action="append", default=[], help="also qag as of this git ref (repeatable)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batches", type=int, default=20, help="batch writes per round (default 20)")
    p.add_argument("--batch", type=int, default=500, help="run records per batch (default 500: a full wake-up)")
    p.add_argument("--pin", default="0", help="the core both threads run on (taskset list; '' = unpinned)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.batch, args.batches)))
        return 0
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QAG_", "QUERYAPIGATE_"))}
    targets = [("worktree", sys.executable, REPO)]
    if args.ref:
        from .refs import venv_python
        # A folder holding only the benchmarks package: a ref's python imports its own qag, not the worktree's.
        only_benchmarks = tempfile.mkdtemp(prefix="qag-bench-writer-wait-")
        os.symlink(os.path.join(REPO, "benchmarks"), os.path.join(only_benchmarks, "benchmarks"))
        targets += [(f"qag@{ref}", venv_python(ref), only_benchmarks) for ref in args.ref]
    results: dict[str, list[dict]] = {name: [] for name, _, _ in targets}
    for r in range(args.rounds):
        for name, python, cwd in targets:
            results[name].append(_run_child(python, cwd, args, env))
            print(f"  round {r} {name}: {results[name][-1]}", file=sys.stderr)

    def spread(values: list[float]) -> str:
        return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"

    print(f"history batch of {args.batch} runs, {args.batches} writes a round, {args.rounds} rounds, pinned to "
          f"{args.pin or 'no core'}: median [min-max] of the rounds' medians")
    print("| target | batch write, wall ms | a waiting thread's longest wait, ms |")
    print("|---|---|---|")
    for name, rounds in results.items():
        print(f"| {name} | {spread([x['write_ms'] for x in rounds])} | {spread([x['wait_ms'] for x in rounds])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
