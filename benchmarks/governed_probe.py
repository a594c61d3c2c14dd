"""A governed call's admission and release in-process, as the request path makes them: python -m benchmarks.governed_probe.

A governed call is a key with a rate limit, `max_concurrent` and a call quota (none of them ever refusing here).
Per call the probe runs what the request path runs around the database call, through the gateway's own methods:

    Gateway._limits(caller, environ, True)      # the key's token bucket, then the quota checked and reserved
    Gateway.slots.acquire(name, limit, None)    # a max_concurrent slot (qag/api/run.py, RunHandlers._execute)
    slot.release()                              # ... given back once the page is encoded
    Gateway._settle_quota(ticket, response)     # the quota settled: the call kept, its rows counted, X-Quota-*

With --server-limit the server-wide bucket of the client address (Gateway._limit_address) is taken too.

Modes:
- default: process CPU per call, median [min-max] of --rounds rounds of --calls calls;
- --callgrind: instructions per call, counted by valgrind's callgrind (deterministic, so valid on a loaded
  machine): the probe runs twice under callgrind, with 0 and with --calls calls after the same warm-up, and
  the difference of the totals is divided by --calls;
- --profile: a cProfile of --calls calls, sorted by own time.

--python runs the probe with another interpreter (a ref's virtual environment from benchmarks.refs, or
/work/main/.venv with PYTHONPATH set to a tree): this file imports nothing but qag and the standard library,
and runs from a directory that holds no `qag`, so that interpreter's qag is measured.
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

KEY = {"name": "governed", "rate_limit": "100000000/minute", "max_concurrent": 1000,
       "quota": {"calls": 100_000_000, "per": "day"}}
ROW_HEADERS = (("X-Page", "1"), ("X-Page-Size", "100"), ("X-Row-Count", "1"), ("X-Has-More", "false"))


def _admin_call(gateway):
    """call(method, path, body) -> JSON: a management request in-process as the administrator (as qag.cli._Admin)."""
    from qag.auth import Caller
    from qag.http.request import Request

    def call(method: str, path: str, body: dict | None = None):
        data = json.dumps(body).encode() if body is not None else b""
        environ = {"REQUEST_METHOD": method, "RAW_URI": path, "REMOTE_ADDR": "127.0.0.1",
                   "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(data)),
                   "wsgi.input": io.BytesIO(data)}
        request = Request(environ, gateway.max_body)
        request.parse_target()
        route, params = gateway.router.match(request.segments, method)
        response = route.handler(request, Caller("cli", True, "cli"), **params)
        return json.loads(response.body) if response.body else None
    return call


def _gateway(home: str, args):
    """(the gateway, the secrets of a governed key and of the same key without limits) on a demo home."""
    from qag import demo
    from qag.app import Gateway
    from qag.settings import load

    env = {"QAG_HOME": home, "QAG_API_KEY": "adm_" + "0" * 48, "QAG_HISTORY_FLUSH_INTERVAL": "60", "QAG_OTEL": "off"}
    if args.server_limit:
        env["QAG_RATE_LIMIT"] = "100000000/minute"
    if os.environ.get("QAG_SPEEDUPS"):
        env["QAG_SPEEDUPS"] = os.environ["QAG_SPEEDUPS"]
    gateway = Gateway(load(env))
    call = _admin_call(gateway)
    if args.what != "admission":
        demo.prepare_home(home, False, call)
    governed = call("POST", "/api/v1/api-keys", KEY)["secret"]
    plain = call("POST", "/api/v1/api-keys", {"name": "plain"})["secret"]
    return gateway, governed, plain


def _caller(gateway, secret: str):
    try:
        return gateway.auth.authenticate(secret, "127.0.0.1", None)
    except TypeError:   # before bearer tokens (issue 23): no Authorization argument
        return gateway.auth.authenticate(secret, "127.0.0.1")


def _admission(gateway, secret: str, server_limit: bool):
    """One governed call's admission and release, as the request path makes them around the database call."""
    from qag.http.request import Request
    from qag.http.response import Response

    caller = _caller(gateway, secret)
    assert caller is not None and caller.grants.max_concurrent
    limits, settle, slots = gateway._limits, gateway._settle_quota, gateway.slots
    name, limit = caller.name, int(caller.grants.max_concurrent)
    environ0 = {"REQUEST_METHOD": "GET", "RAW_URI": "/q/customer?id=1", "REMOTE_ADDR": "127.0.0.1",
                "wsgi.input": io.BytesIO(b"")}
    request = Request(dict(environ0), gateway.max_body, gateway.trust_proxy) if server_limit else None

    def call(i: int) -> None:
        if request is not None:
            gateway._limit_address(request)
        environ = {}
        limits(caller, environ, True)
        slot = slots.acquire(name, limit, None)
        assert slot is not None
        slot.release()
        ticket = environ["qag.quota"]
        response = Response(200, b"[]", list(ROW_HEADERS), "application/json")
        settle(ticket, response)
    return call


def _whole(gateway, secret: str):
    """One whole in-process call of the demo's `customer` through Gateway.__call__ (no HTTP server)."""
    def call(i: int) -> None:
        query = f"id={i % 5000 + 1}"
        environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/q/customer", "QUERY_STRING": query,
                   "REMOTE_ADDR": "127.0.0.1", "RAW_URI": f"/q/customer?{query}", "wsgi.input": io.BytesIO(b""),
                   "HTTP_X_API_KEY": secret}
        status = []
        b"".join(gateway(environ, lambda s, h: status.append(s)))
        assert status[0].startswith("200"), status
    return call


def _run(args) -> None:
    home = tempfile.mkdtemp(prefix="qag-governed-probe-")
    try:
        gateway, governed, plain = _gateway(home, args)
        if args.what == "admission":
            call = _admission(gateway, governed, args.server_limit)
        else:
            call = _whole(gateway, governed if args.what == "call" else plain)
        for i in range(args.warmup):
            call(i)
        if args.mode == "callgrind":
            # Counted only inside functools.reduce (--toggle-collect): the calls, nothing before or after.
            functools.reduce(lambda _, i: call(i), range(args.calls), None)
            print("done")
        elif args.mode == "profile":
            import cProfile
            import pstats
            profile = cProfile.Profile()
            profile.enable()
            for i in range(args.calls):
                call(i)
            profile.disable()
            pstats.Stats(profile).sort_stats("tottime").print_stats(30)
        else:
            per = []
            for _ in range(args.rounds):
                start = time.process_time()
                for i in range(args.calls):
                    call(i)
                per.append((time.process_time() - start) / args.calls * 1e6)
            from qag import _speedups
            print(f"{args.what}: process CPU µs per call {statistics.median(per):.2f} "
                  f"[{min(per):.2f}–{max(per):.2f}] ({args.rounds} rounds x {args.calls} calls; "
                  f"shmsync {_speedups.choices().get('shmsync')})")
        gateway.close()
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _instructions(python: str, calls: int, args, env: dict) -> int:
    """Instructions of the calls in the probe's main thread (callgrind, one output per thread, collecting only
    inside the loop): the gateway's writer threads wake on timers, so what they run depends on how long the run
    takes, not on the calls."""
    out = tempfile.mkdtemp(prefix="qag-probe-callgrind-")
    command = ["valgrind", "--tool=callgrind", "--separate-threads=yes", "--collect-atstart=no",
               "--toggle-collect=functools_reduce",
               f"--callgrind-out-file={os.path.join(out, 'callgrind.out')}", python, os.path.abspath(__file__),
               "--child", "callgrind", "--calls", str(calls), "--warmup", str(args.warmup), "--what", args.what]
    if args.server_limit:
        command.append("--server-limit")
    try:
        done = subprocess.run(command, cwd=tempfile.gettempdir(), env=env, capture_output=True, text=True)
        if done.returncode or "done" not in done.stdout:
            sys.exit(f"the probe failed under callgrind:\n{done.stdout}\n{done.stderr[-3000:]}")
        main_thread = os.path.join(out, "callgrind.out-01")
        with open(main_thread) as fh:
            text = fh.read()
        totals = re.search(r"^totals:\s+(\d+)", text, re.M) or re.search(r"^summary:\s+(\d+)", text, re.M)
        if args.keep:
            shutil.copy(main_thread, args.keep if calls else args.keep + ".base")
        return int(totals.group(1))
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--what", choices=("admission", "call", "plain-call"), default="admission",
                        help="admission: the governed key's limits around a call (default); call: a whole in-process "
                             "call of the demo's customer by the governed key; plain-call: the same by a key without "
                             "limits")
    parser.add_argument("--server-limit", action="store_true", help="also the server-wide bucket (QAG_RATE_LIMIT)")
    parser.add_argument("--callgrind", action="store_true", help="instructions per call (valgrind)")
    parser.add_argument("--profile", action="store_true", help="cProfile of --calls calls")
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose qag is measured")
    parser.add_argument("--keep", help="with --callgrind: keep the measured run's callgrind output here (and the run without calls' in "
                             "KEEP.base)")
    parser.add_argument("--child", choices=("callgrind", "cpu", "profile"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        # Run as a script: its folder (benchmarks/, whose profile.py would hide the standard library's) goes.
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
        args.mode = args.child
        _run(args)
        return
    env = dict(os.environ, PYTHONHASHSEED="0")
    if args.callgrind:
        base = _instructions(args.python, 0, args, env)
        total = _instructions(args.python, args.calls, args, env)
        print(f"{args.what}: {(total - base) / args.calls:,.0f} instructions per call "
              f"(callgrind; {args.calls} calls, {total:,} - {base:,}; {args.python}"
              f"{', PYTHONPATH=' + env['PYTHONPATH'] if env.get('PYTHONPATH') else ''}"
              f"{', QAG_SPEEDUPS=' + env['QAG_SPEEDUPS'] if env.get('QAG_SPEEDUPS') else ''})")
        return
    command = [args.python, os.path.abspath(__file__), "--child", "profile" if args.profile else "cpu",
               "--calls", str(args.calls), "--rounds", str(args.rounds), "--warmup", str(args.warmup),
               "--what", args.what]
    if args.server_limit:
        command.append("--server-limit")
    sys.exit(subprocess.run(command, cwd=tempfile.gettempdir(), env=env).returncode)


if __name__ == "__main__":
    main()
