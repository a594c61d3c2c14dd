"""The things a benchmark drives: qag (variants and git refs), a peer gateway from a command line (with a
ready recipe for QueryAPIGate 0.43), the bare ceiling of gunicorn's gthread worker, and the database directly.

Spec strings (`--target`, repeatable):

    qag                          qag's defaults (QAG_WORKERS=2, QAG_THREADS=8)
    qag:workers=4,threads=4      a variant; any other key=value becomes an environment variable (QAG_POOL_SIZE=4,
                                 QAG_WORKER_CLASS=gthread)
    qag@<git ref>:...            the qag built from that ref (see refs.py), same options
    bare:workers=2,threads=8     a trivial WSGI app under gunicorn's gthread worker (bare:worker=qag: qag's worker)
    queryapigate:threads=8       QueryAPIGate 0.43 from PyPI in its own venv, at its best (measuring note)
    queryapigate-defaults        QueryAPIGate 0.43 as its image runs it (metadata cache off, logs on)
    peer:<name>=<command>        any gateway with the same HTTP contract; the command may use {port}, {home},
                                 {admin_key}, {workers}, {threads} and must serve on 127.0.0.1:{port}
    direct:threads=32            the database directly (benchmarks/dbdirect.c), same SQL, same users
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
# Outside the work tree by default, so a peer's installed code can never be swept into a commit.
VENVS = os.environ.get("QAG_BENCH_VENVS", os.path.join(tempfile.gettempdir(), "qag-bench-venvs"))
QUERYAPIGATE_VENV = os.environ.get("QAG_BENCH_QUERYAPIGATE_VENV", os.path.join(VENVS, "queryapigate-0.43"))
QUERYAPIGATE_PIP = ["queryapigate[server,mysql,postgres,redis]==0.43.0", "sqlglot>=25.2,<31"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_options(text: str) -> dict[str, str]:
    out = {}
    for item in filter(None, text.split(",")):
        k, _, v = item.partition("=")
        out[k.strip()] = v.strip()
    return out


@dataclass
class Target:
    """A started HTTP target (or the direct client): name, kind, settings and the process to measure."""

    name: str
    kind: str                       # qag | bare | peer | direct
    settings: dict = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    port: int = 0
    home: str = ""
    admin_key: str = ""
    version: str = ""
    log_path: str = ""

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def http(self) -> bool:
        return self.kind != "direct"

    # --- lifecycle ----------------------------------------------------------------------------------------
    def wait_healthy(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                status, body = self.request("GET", "/health", key=None)
                if status == 200:
                    try:
                        self.version = json.loads(body).get("version", "") or self.version
                    except ValueError:
                        pass
                    return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"target {self.name} did not answer /health; its log: {self.log_path}\n" + self.log_tail())

    def log_tail(self, n: int = 30) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as fh:
                return "".join(fh.readlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.home and self.home.startswith(tempfile.gettempdir()):
            shutil.rmtree(self.home, ignore_errors=True)

    # --- HTTP ---------------------------------------------------------------------------------------------
    def request(self, method: str, path: str, body: dict | None = None, key: str | None = "admin"):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        headers = {}
        if key == "admin":
            key = self.admin_key
        if key:
            headers["X-API-Key"] = key
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, path, body=data, headers=headers)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def provision(self, case) -> dict:
        """Create the case's connection, saved queries and two keys; returns {"plain": key, "governed": key}."""
        if self.kind == "bare":
            return {"plain": "", "governed": ""}
        if getattr(case, "setup_home", None):
            case.setup_home(self.home)
        status, body = self.request("POST", "/api/v1/connections", case.connection)
        if status != 201:
            raise RuntimeError(f"{self.name}: creating connection failed: {status} {body[:300]!r}")
        for q in case.queries:
            status, body = self.request("POST", "/api/v1/queries", q.create_body(case.connection["name"]))
            if status != 201:
                raise RuntimeError(f"{self.name}: creating query {q.name} failed: {status} {body[:300]!r}")
        keys = {}
        for label in ("plain", "governed"):
            status, body = self.request("POST", "/api/v1/api-keys",
                                        case.key_body(f"bench-{label}", list(case.queries), label == "governed"))
            if status != 201:
                keys[label] = None
                keys[f"{label}_error"] = f"{status} {body[:200]!r}"
                continue
            keys[label] = json.loads(body)["secret"]
        return keys


def _spawn(target: Target, cmd: list[str], env: dict, pin: str | None, cwd: str, wrap: list[str] = ()) -> None:
    cmd = [*wrap, *cmd]
    if pin:
        cmd = ["taskset", "-c", pin, *cmd]
    target.log_path = os.path.join(target.home or tempfile.gettempdir(), f"{target.name}.log")
    log = open(target.log_path, "w")
    target.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                                   start_new_session=True)
    log.close()


def _clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith(("QAG_", "QUERYAPIGATE_", "GUNICORN_"))}


def qag_python(ref: str | None) -> str:
    if ref is None:
        return sys.executable
    from .refs import venv_python
    return venv_python(ref)


def start(spec: str, pin: str | None = None, allow_writes: bool = True, wrap: list[str] = (),
          boot_seconds: float = 60) -> Target:
    """Start the target described by `spec` (see the module docstring) and wait for its /health (at most
    boot_seconds); a qag or bare target runs under the command `wrap` when given (valgrind ...)."""
    head, _, opts_text = spec.partition(":")
    if head == "peer":
        name, _, command = opts_text.partition("=")
        return _start_peer(name, command, {}, pin)
    opts = parse_options(opts_text)
    workers = int(opts.pop("workers", 2 if head.startswith("qag") or head == "bare" else 1))
    threads = int(opts.pop("threads", 8))
    label = spec.replace(":", " ").replace(",", " ").strip()
    if head == "direct":
        return Target(label, "direct", {"client": "benchmarks/dbdirect.c", "callers": "as the phase"})
    home = tempfile.mkdtemp(prefix="qag-bench-home-")
    env = _clean_env()
    env.update({k: v for k, v in opts.items()})
    if head.startswith("qag"):
        ref = head.partition("@")[2] or None
        sha = None
        if ref:
            from .refs import resolve
            sha = resolve(ref)[:12]
        t = Target(label, "qag", {"workers": workers, "threads": threads, "ref": ref or "worktree", "sha": sha, **opts},
                   home=home, admin_key="adm-" + secrets.token_hex(16), port=free_port())
        # QAG_SPEEDUPS=require: a build that is stale or missing refuses to start instead of running the whole
        # process pure and being measured as qag (a spec's QAG_SPEEDUPS=off|auto still says otherwise).
        env.update({"QAG_HOME": home, "QAG_API_KEY": t.admin_key, "QAG_BIND": f"127.0.0.1:{t.port}",
                    "QAG_WORKERS": str(workers), "QAG_THREADS": str(threads), "QAG_ACCESS_LOG": "off",
                    "QAG_ALLOW_WRITES": "1" if allow_writes else "0", "QAG_SPEEDUPS": "require"})
        env.update({k: v for k, v in opts.items()})
        _spawn(t, [qag_python(ref), "-m", "qag", "serve"], env, pin, cwd=home, wrap=wrap)
    elif head == "bare":
        worker = opts.pop("worker", "gthread")
        t = Target(label, "bare", {"workers": workers, "threads": threads, "worker": worker}, home=home,
                   port=free_port())
        worker_class = "qag.worker.QagWorker" if worker == "qag" else worker
        cmd = [sys.executable, "-m", "gunicorn", "--worker-class", worker_class, "--workers", str(workers),
               "--threads", str(threads), "--bind", f"127.0.0.1:{t.port}", "--keep-alive", "5",
               "--log-level", "warning", "benchmarks.bare_app:app"]
        _spawn(t, cmd, env, pin, cwd=REPO, wrap=wrap)
    elif head in ("queryapigate", "queryapigate-defaults"):
        return _start_queryapigate(head, workers if "workers" in opts_text else 1, threads, opts, pin, allow_writes)
    else:
        raise ValueError(f"unknown target {spec!r}")
    t.wait_healthy(time.monotonic() + boot_seconds)
    return t


def queryapigate_env(venv: str) -> dict:
    """LD_PRELOAD of the OpenSSL that mysql-connector's wheel vendors, so its C extension loads (the note)."""
    site = subprocess.run([os.path.join(venv, "bin", "python"), "-c", "import site; print(site.getsitepackages()[0])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    vendor = os.path.join(site, "mysql", "vendor")
    libs = [os.path.join(vendor, n) for n in ("libcrypto.so.3", "libssl.so.3")]
    return {"LD_PRELOAD": ":".join(libs)} if all(os.path.exists(p) for p in libs) else {}


def install_queryapigate(venv: str = QUERYAPIGATE_VENV) -> str:
    if not os.path.exists(os.path.join(venv, "bin", "gunicorn")):
        subprocess.run([shutil.which("python3") or sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([os.path.join(venv, "bin", "pip"), "install", "-q", *QUERYAPIGATE_PIP], check=True)
    return venv


def _start_queryapigate(head: str, workers: int, threads: int, opts: dict, pin: str | None,
                        allow_writes: bool) -> Target:
    venv = install_queryapigate()
    home = tempfile.mkdtemp(prefix="qag-bench-qapg-")
    best = head == "queryapigate"
    t = Target(f"{head} w{workers} t{threads}", "peer", {"workers": workers, "threads": threads,
               "config": "best" if best else "defaults", **opts}, home=home,
               admin_key="adm-" + secrets.token_hex(16), port=free_port())
    env = _clean_env()
    env.update(queryapigate_env(venv))
    env.update({"QUERYAPIGATE_HOME": home, "QUERYAPIGATE_API_KEY": t.admin_key, "QUERYAPIGATE_THREADS": str(threads),
                "QUERYAPIGATE_ALLOW_WRITES": "1" if allow_writes else "0"})
    if best:
        env.update({"QUERYAPIGATE_METADATA_CACHE_TTL": "5", "QUERYAPIGATE_ACCESS_LOG": "off",
                    "QUERYAPIGATE_LOG_REQUESTS": "off"})
    env.update(opts)
    t.settings["env"] = {k: v for k, v in env.items() if k.startswith("QUERYAPIGATE_") and k != "QUERYAPIGATE_API_KEY"}
    t.settings["cext_preload"] = "LD_PRELOAD" in env
    cmd = [os.path.join(venv, "bin", "gunicorn"), "--workers", str(workers), "--worker-class", "gthread",
           "--threads", str(threads), "--timeout", "120", "--graceful-timeout", "30",
           "--bind", f"127.0.0.1:{t.port}", "-c", "python:queryapigate.gunicorn_conf", "queryapigate.app:create_app()"]
    t.settings["command"] = " ".join(shlex.quote(c) for c in cmd)
    _spawn(t, cmd, env, pin, cwd=home)
    t.wait_healthy(time.monotonic() + 90)
    return t


def _start_peer(name: str, command: str, opts: dict, pin: str | None) -> Target:
    home = tempfile.mkdtemp(prefix="qag-bench-peer-")
    t = Target(name, "peer", {"command": command}, home=home, admin_key="adm-" + secrets.token_hex(16),
               port=free_port())
    text = command.format(port=t.port, home=home, admin_key=t.admin_key, workers=opts.get("workers", 2),
                          threads=opts.get("threads", 8))
    _spawn(t, ["sh", "-c", "exec " + text], _clean_env(), pin, cwd=home)
    t.wait_healthy(time.monotonic() + 90)
    return t
