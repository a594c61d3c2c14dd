"""A real `qag serve` (gunicorn, several workers) on an ephemeral port, and a small HTTP client for it."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from urllib.parse import quote, urlencode

ADMIN_KEY = "test-admin-key-0123456789"
_LISTENING = re.compile(r"Listening at: http://([\d.]+):(\d+)")


class Reply:
    """One HTTP response: status, headers (lower-case names), raw body, and the body as JSON."""

    def __init__(self, status: int, headers: list[tuple[str, str]], body: bytes):
        self.status = status
        self.header_list = headers
        self.headers = {k.lower(): v for k, v in headers}
        self.body = body

    @property
    def json(self):
        return json.loads(self.body)

    def __repr__(self) -> str:
        return f"<Reply {self.status} {self.body[:200]!r}>"


class ServerExited(RuntimeError):
    """A call refused because the server's process has ended."""


# QAG_TEST_STORE=postgresql: the PostgreSQL store each server's home stands for.
_STORE_OF_HOME: dict[str, str] = {}


class Server:
    """A gunicorn master with its workers, started from the installed `qag` code with its own home."""

    def __init__(self, env: dict[str, str] | None = None, workers: int = 2, threads: int = 4,
                 admin_key: str | None = ADMIN_KEY, host: str = "127.0.0.1"):
        self.home = tempfile.mkdtemp(prefix="qag-test-")
        self.admin_key = admin_key
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(("QAG_", "QUERYAPIGATE_"))}
        full_env.update({"QAG_HOME": self.home, "QAG_BIND": f"{host}:0", "QAG_WORKERS": str(workers),
                         "QAG_THREADS": str(threads), "QAG_ACCESS_LOG": "off"})
        for name in ("QAG_SPEEDUPS", "QAG_WORKER_CLASS"):   # the twins and the worker class under test
            if name in os.environ:
                full_env[name] = os.environ[name]
        if admin_key is not None:
            full_env["QAG_API_KEY"] = admin_key
        full_env.update(env or {})
        self._drop_store = None
        if os.environ.get("QAG_TEST_STORE") == "postgresql" and "QAG_DATABASE_URL" not in full_env:
            shared = _STORE_OF_HOME.get(full_env["QAG_HOME"])
            if shared is not None:
                # A second instance given another server's home shares its store, as it would on SQLite.
                full_env["QAG_DATABASE_URL"] = shared
            else:
                # The whole suite on the PostgreSQL store: each server gets a fresh schema of the tests' store
                # database.
                from tests.services import pg_store_fields, pg_schema_url
                full_env["QAG_DATABASE_URL"], self._drop_store = pg_schema_url(pg_store_fields())
                _STORE_OF_HOME[self.home] = full_env["QAG_DATABASE_URL"]
        self.database_url = full_env.get("QAG_DATABASE_URL") or None  # "" pins the SQLite store
        self.log: list[str] = []
        self.proc = subprocess.Popen([sys.executable, "-m", "qag", "serve"], env=full_env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, cwd=self.home)
        self.host, self.port = self._wait_listening(deadline=time.monotonic() + 30)
        self._wait_healthy(deadline=time.monotonic() + 30)

    def _wait_listening(self, deadline: float) -> tuple[str, int]:
        found: list[tuple[str, int]] = []
        ready = threading.Event()

        def pump():
            for line in self.proc.stdout:
                self.log.append(line)
                m = _LISTENING.search(line)
                if m and not found:
                    found.append((m.group(1), int(m.group(2))))
                    ready.set()
            ready.set()

        self._pump = threading.Thread(target=pump, daemon=True)
        self._pump.start()
        ready.wait(max(0.0, deadline - time.monotonic()))
        if not found:
            self.stop()
            raise RuntimeError("qag serve did not start:\n" + "".join(self.log))
        return found[0]

    def _wait_healthy(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            try:
                if self.get("/health").status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("qag serve never answered /health:\n" + "".join(self.log))

    def close(self) -> None:
        """Stop the server and remove its temporary home: tests leave nothing behind."""
        self.stop()
        pump = getattr(self, "_pump", None)
        if pump is not None:   # the output pipe ends with the server: closed once read to its end
            pump.join(10)
            if not pump.is_alive():
                self.proc.stdout.close()
        shutil.rmtree(self.home, ignore_errors=True)
        if self._drop_store is not None:
            self._drop_store()
            self._drop_store = None

    def stop(self) -> int | None:
        return terminate(self.proc)

    def store_sql(self, statement: str, args: tuple = ()) -> list[tuple]:
        """A statement on this server's store (its SQLite file, or its PostgreSQL database), outside qag."""
        return store_sql(os.path.join(self.home, "qag.db"), self.database_url, statement, args)

    # --- HTTP ----------------------------------------------------------------------------------------------
    def redis_prefix(self) -> str:
        """The names this server's deployment gives Redis start with this (qag/redisconn.namespace_prefix)."""
        from qag.redisconn import namespace_prefix
        (secret,) = self.store_sql("SELECT value FROM meta WHERE key = 'server_secret'")[0]
        return namespace_prefix(secret.encode("ascii"))

    def request(self, method: str, path: str, *, body=None, raw: bytes | None = None, key: str | None = "admin",
                headers: dict[str, str] | None = None, params: dict | None = None, host: str | None = None) -> Reply:
        all_headers = dict(headers or {})
        if key == "admin":
            key = self.admin_key
        if key is not None:
            all_headers["X-API-Key"] = key
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
            all_headers.setdefault("Content-Type", "application/json")
        if params:
            path += ("&" if "?" in path else "?") + urlencode(params)
        conn = http.client.HTTPConnection(host or self.host, self.port, timeout=30)
        try:
            conn.request(method, path, body=data, headers=all_headers)
            response = conn.getresponse()
            return Reply(response.status, response.getheaders(), response.read())
        except ConnectionRefusedError:
            self._raise_if_exited()
            raise
        finally:
            conn.close()

    def _raise_if_exited(self) -> None:
        """A refused connection to a server whose process has ended (gunicorn's master stops the whole server
        when a worker fails to boot): fail with what the server printed, not a bare refusal."""
        try:
            code = self.proc.wait(2)
        except subprocess.TimeoutExpired:
            return
        self._pump.join(5)
        raise ServerExited(f"qag serve exited with {code}; its output ends:\n" + "".join(self.log[-80:]))

    def get(self, path: str, **kw) -> Reply:
        return self.request("GET", path, **kw)

    def post(self, path: str, body=None, **kw) -> Reply:
        return self.request("POST", path, body=body, **kw)

    # --- which worker answered -----------------------------------------------------------------------------
    def worker_of(self, reply: Reply, deadline: float = 10.0) -> int:
        """The pid of the worker that answered `reply`, from its access-log line (the server must have been
        started with QAG_ACCESS_LOG=on; lines arrive a little after their responses)."""
        rid = reply.headers["x-request-id"]
        pattern = re.compile(r"rid=" + re.escape(rid) + r" pid=<(\d+)>")

        def find():
            for line in list(self.log):
                m = pattern.search(line)
                if m:
                    return int(m.group(1))
            return None
        return wait_for(find, f"the access-log line of request {rid}", deadline)

    def workers_of(self, replies: list[Reply]) -> set[int]:
        """The pids of the workers that answered any of `replies`."""
        return {self.worker_of(reply) for reply in replies}

    def answered_by_every_worker(self, path: str, workers: int, deadline: float = 30.0, **kw) -> set[int]:
        """Call `path` until each of `workers` workers has answered it (the server must log access lines,
        QAG_ACCESS_LOG=on), every reply a 200; their pids. A worker that answered has built its gateway, its store
        opened: a drill that then takes the store away can't catch a worker still booting (on a loaded machine
        it would fail to start and print a traceback, which is not what such a drill is about)."""
        answered: set[int] = set()
        give_up = time.monotonic() + deadline
        while len(answered) < workers:
            assert time.monotonic() < give_up, f"only workers {answered} answered"
            replies = [self.get(path, **kw) for _ in range(4 * workers)]
            assert all(r.status == 200 for r in replies), replies
            answered |= self.workers_of(replies)
        return answered

    def connections_per_worker(self, workers: int, path: str, rounds: int = 20) -> dict[int, "KeptConnection"]:
        """{pid: a kept-alive connection that worker serves} for `workers` workers. Calls `path` (a slow call
        spreads best) concurrently on new connections until every worker has answered one; a kept-alive
        connection stays with the worker that accepted it."""
        found: dict[int, KeptConnection] = {}
        for _ in range(rounds):
            # A found connection idle past gunicorn's keep-alive (5 s) would be closed by its worker: on a loaded
            # machine the search can take longer than that, so each round uses the ones found so far.
            for conn in found.values():
                assert conn.get("/livez").status == 200
            fresh = [KeptConnection(self) for _ in range(4 * workers)]
            replies: list = [None] * len(fresh)
            start = threading.Barrier(len(fresh))

            def call(i: int) -> None:
                start.wait()
                replies[i] = fresh[i].get(path)
            threads = [threading.Thread(target=call, args=(i,)) for i in range(len(fresh))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for conn, reply in zip(fresh, replies):
                pid = self.worker_of(reply)
                if pid in found or len(found) == workers:
                    conn.close()
                else:
                    found[pid] = conn
            if len(found) == workers:
                return found
        raise AssertionError(f"only {len(found)} of {workers} workers answered in {rounds} rounds")

    # --- fixtures of data ----------------------------------------------------------------------------------
    def sqlite_db(self, name: str, script: str) -> str:
        """Create a SQLite file in the home (relative path returned) from a SQL script."""
        path = os.path.join(self.home, name)
        conn = sqlite3.connect(path)
        conn.executescript(script)
        conn.commit()
        conn.close()
        return name

    def connection(self, name: str, database: str, **extra) -> Reply:
        reply = self.post("/api/v1/connections", {"name": name, "db": "sqlite", "database": database, **extra})
        assert reply.status == 201, self._explain(reply)
        return reply

    def query(self, name: str, sql: str, connection: str | None, publish: bool = True, **extra) -> Reply:
        body = {"name": name, "description": f"test query {name}", "sql": sql, "publish": publish, **extra}
        if connection is not None:
            body["connection_name"] = connection
        reply = self.post("/api/v1/queries", body)
        assert reply.status == 201, self._explain(reply)
        return reply

    def key(self, name: str, **grants) -> str:
        reply = self.post("/api/v1/api-keys", {"name": name, **grants})
        assert reply.status == 201, self._explain(reply)
        return reply.json["secret"]

    def _explain(self, reply: Reply) -> str:
        """A set-up call's unexpected reply with what the server logged about it, so a failure says why."""
        try:
            request_id = str(reply.json.get("request_id") or "")
        except (ValueError, AttributeError):   # not a JSON object: no request id to look for
            request_id = ""
        time.sleep(0.2)   # the server's lines about the call may still be on their way through the pipe
        lines = [line for line in self.log
                 if (request_id and request_id in line) or "WARNING" in line or "ERROR" in line]
        return f"{reply!r}; the server logged:\n" + "".join(lines[-40:] or self.log[-20:])


class KeptConnection:
    """One kept-alive HTTP connection to a server (so every call on it reaches the same worker)."""

    def __init__(self, server: Server):
        self.server = server
        self.conn = http.client.HTTPConnection(server.host, server.port, timeout=30)

    def request(self, method: str, path: str, *, key: str | None = "admin",
                headers: dict[str, str] | None = None) -> Reply:
        all_headers = dict(headers or {})
        if key is not None:
            all_headers["X-API-Key"] = self.server.admin_key if key == "admin" else key
        self.conn.request(method, path, headers=all_headers)
        response = self.conn.getresponse()
        return Reply(response.status, response.getheaders(), response.read())

    def get(self, path: str, **kw) -> Reply:
        return self.request("GET", path, **kw)

    def close(self) -> None:
        self.conn.close()


def q(name: str) -> str:
    return "/q/" + quote(name)


def check_demo(command: list[str], home: str) -> None:
    """Run `<command> demo`, read the banner, and prove its three curl lines return rows; then stop it."""
    import urllib.request
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QAG_", "QUERYAPIGATE_"))}
    env.update({"QAG_WORKERS": "2", "QAG_ACCESS_LOG": "off"})
    proc = subprocess.Popen([*command, "demo", "--home", home, "--bind", "127.0.0.1:0"], env=env,
                            stderr=subprocess.PIPE, text=True, cwd=os.path.dirname(home))
    lines: list[str] = []
    try:
        port = None
        curl = re.compile(r"curl -s -H 'X-API-Key: ([^']+)' '([^']+)'")
        deadline = time.monotonic() + 120
        # The banner comes once the server listens, after gunicorn's "Listening at" line.
        while len(curl.findall("".join(lines))) < 3 and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            m = _LISTENING.search(line)
            port = port or (m.group(2) if m else None)
        text = "".join(lines)
        assert port, text
        curls = curl.findall(text)
        assert len(curls) == 3, text
        for key, url in curls:
            assert f"127.0.0.1:{port}/" in url, (url, port)   # the banner names the port port 0 became
            with urllib.request.urlopen(urllib.request.Request(url, headers={"X-API-Key": key}), timeout=30) as r:
                body = r.read()
            assert r.status == 200 and len(body) > 20 and b"No results" not in body, (url, body)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def wait_for(check, what: str, deadline: float = 20.0):
    """check()'s first truthy value, polled every 0.1 s; AssertionError naming `what` after `deadline` seconds."""
    end = time.monotonic() + deadline
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def terminate(proc: subprocess.Popen) -> int | None:
    """SIGTERM (a graceful stop), then SIGKILL after 30 s; the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def store_sql(sqlite_path: str, database_url: str | None, statement: str, args: tuple = ()) -> list[tuple]:
    """A statement on a store outside qag: the SQLite file, or the PostgreSQL database when a URL is given
    (`?` placeholders either way)."""
    if database_url is None:
        conn = sqlite3.connect(sqlite_path)
        try:
            with conn:
                return conn.execute(statement, args).fetchall()
        finally:
            conn.close()
    import psycopg2
    conn = psycopg2.connect(database_url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(statement.replace("?", "%s"), args)
            return cur.fetchall() if cur.description else []
    finally:
        conn.close()
