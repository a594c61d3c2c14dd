"""The operator's CLI (issue 22.9): qag config, qag check, qag size's defaults, serve's help, open mode, a taken port
said once, and the real port of --bind :0."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time

import pytest

from qag.sizing import MEASURED_CPU_US

from tests.integration.test_ops_and_cli import qag_cli
from tests.server import wait_for

pytestmark = pytest.mark.e2e

SECRET = "admin-secret-never-printed-42"


def test_config_shows_every_setting_its_source_and_masks_secrets(tmp_path):
    r = qag_cli("config", "--json", "--home", str(tmp_path), env={
        "QAG_API_KEY": SECRET, "QUERYAPIGATE_THREADS": "6",
        "QAG_DATABASE_URL": "postgresql://u:pw-in-url-9@db.example/qag"})
    assert r.returncode == 0, r.stderr
    assert SECRET not in r.stdout and "pw-in-url-9" not in r.stdout
    shown = json.loads(r.stdout)
    assert shown["QAG_API_KEY"] == {"value": "********", "from": "QAG_API_KEY"}
    assert shown["QAG_THREADS"] == {"value": "6", "from": "QUERYAPIGATE_THREADS"}
    assert shown["QAG_HOME"] == {"value": str(tmp_path), "from": "--home"}
    assert shown["QAG_WORKERS"]["from"] == "default"
    assert shown["QAG_POOL_SIZE"] == {"value": "6", "from": "derived"}
    assert shown["QAG_DATABASE_URL"]["value"] == "postgresql://u:***@db.example/qag"
    plain = qag_cli("config", "--home", str(tmp_path), env={"QAG_API_KEY": SECRET})
    assert plain.returncode == 0 and SECRET not in plain.stdout
    assert re.search(r"^QAG_API_KEY\s+\*{8}\s+\(QAG_API_KEY\)$", plain.stdout, re.M)
    # Invalid settings: the same one line as qag serve.
    bad = qag_cli("config", env={"QAG_WORKERS": "zero"})
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "QAG_WORKERS" in bad.stderr


def test_check_tests_every_connection_and_answers_0_or_1(tmp_path):
    home = str(tmp_path)
    sqlite3.connect(tmp_path / "lite.db").close()
    assert qag_cli("connections", "add", "--db", "sqlite", "--database", "lite.db", "lite", home=home).returncode == 0
    ok = qag_cli("check", home=home)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert re.search(r"^ok\s+lite \(sqlite\) [\d.]+ ms$", ok.stdout, re.M)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()   # nothing listens there now
    added = qag_cli("connections", "add", "--db", "postgres", "--host", "127.0.0.1", "--port", str(port),
                    "--database", "x", "--user", "u", "--password", "pw-not-shown-5", "down", home=home)
    assert added.returncode == 0, added.stderr
    failed = qag_cli("check", home=home)
    assert failed.returncode == 1
    assert re.search(r"^FAIL\s+down \(postgres\): 502 connection_failed: ", failed.stdout, re.M)
    assert "pw-not-shown-5" not in failed.stdout + failed.stderr
    assert "1 of 2 connections failed" in failed.stderr
    assert qag_cli("check", env={"QAG_WORKER": "2"}, home=home).returncode == 1   # bad settings: 1 as well


def test_admin_lines_name_the_thing_in_the_singular(tmp_path):
    home = str(tmp_path)
    qag_cli("connections", "add", "--db", "sqlite", "--database", "lite.db", "lite", home=home)
    r = qag_cli("queries", "add", "--sql", "SELECT 1 AS v", "--description", "d", "--connection", "lite", "one",
                home=home)
    assert r.returncode == 0 and r.stderr.strip() == "created query 'one'"


def test_serve_help_points_to_the_settings_and_size_answers_without_figures():
    r = qag_cli("serve", "--help")
    assert r.returncode == 0 and "docs/configuration.md" in r.stdout and "qag config" in r.stdout
    size = qag_cli("size", "--cores", "2")
    assert size.returncode == 0
    assert "assuming --rate 1000, --query-ms 1" in size.stdout and f"{MEASURED_CPU_US:g} µs" in size.stdout
    assert "QAG_WORKERS=" in size.stdout


def _serve_until_listening(tmp_path, *args, env=None):
    full = {k: v for k, v in os.environ.items() if not k.startswith(("QAG_", "QUERYAPIGATE_"))}
    full.update({"QAG_HOME": str(tmp_path), "QAG_WORKERS": "1", **(env or {})})
    proc = subprocess.Popen([sys.executable, "-m", "qag", "serve", *args], env=full, stderr=subprocess.PIPE,
                            text=True)
    lines = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
        if line.startswith("qag: listening on"):
            break
    return proc, lines


def _stop(proc) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_bind_port_zero_says_the_real_port_and_open_mode_says_so(tmp_path):
    proc, lines = _serve_until_listening(tmp_path, "--bind", ":0")
    try:
        assert any(line.startswith("qag: open mode (no QAG_API_KEY): only callers on this machine") for line in lines)
        m = re.match(r"qag: listening on http://127\.0\.0\.1:(\d+)$", lines[-1])
        assert m and int(m.group(1)) != 0, lines
        with socket.create_connection(("127.0.0.1", int(m.group(1))), timeout=5):
            pass
    finally:
        _stop(proc)


def test_a_taken_port_is_said_once_before_anything_else(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        r = qag_cli("serve", "--bind", f"127.0.0.1:{port}", home=str(tmp_path))
        assert r.returncode == 2
        assert r.stderr.splitlines() == [
            f"qag: QAG_BIND 127.0.0.1:{port}: the port is in use by another process; pick another, e.g. qag serve "
            f"--bind 127.0.0.1:{port + 1} (or --bind 127.0.0.1:0 for any free port)"]
        demo = qag_cli("demo", "--bind", f"127.0.0.1:{port}", "--home", str(tmp_path / "demo"))
        assert demo.returncode == 2 and demo.stderr.splitlines()[0].startswith(
            f"qag: QAG_BIND 127.0.0.1:{port}: the port is in use") and "qag demo --bind" in demo.stderr
        assert len(demo.stderr.splitlines()) == 1 and not (tmp_path / "demo").exists()
    finally:
        taken.close()


def _one_line(r, rc: int = 2) -> str:
    assert r.returncode == rc and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("qag: "), r.stderr
    return lines[0]


def test_a_subcommands_own_arguments_are_named_when_wrong(tmp_path):
    home = str(tmp_path)
    # connections add's --port is the database's, never QAG_BIND ("QAG_BIND must be host:port" before).
    assert _one_line(qag_cli("connections", "add", "x", "--db", "postgres", "--port", "abc", home=home)) == \
        "qag: --port must be the database server's port, a number from 1 to 65535 (or a ${VARIABLE} naming one), " \
        "not 'abc'"
    ok = qag_cli("connections", "add", "y", "--db", "postgres", "--host", "db.example", "--port", "5433", home=home)
    assert ok.returncode == 0, ok.stderr
    shown = json.loads(qag_cli("connections", "show", "y", home=home).stdout)
    assert (shown["host"], shown["port"]) == ("db.example", 5433)
    # A bare JSON error and "dictionary update sequence element #0 has length 1" before.
    assert _one_line(qag_cli("queries", "add", "q", "--sql", "SELECT 1", "--description", "d", "--parameters",
                             "notjson", home=home)).startswith(
        "qag: --parameters must be a JSON object of parameter rules, e.g. '{\"id\": {\"type\": \"integer\"}}'; "
        "this is not JSON (")
    assert _one_line(qag_cli("connections", "add", "z", "--db", "sqlite", "--database", "z.db", "--option",
                             "a=1", "--option", "pw-not-shown", home=home)) == \
        "qag: --option takes KEY=VALUE (e.g. --option sslmode=require); one of them has no KEY="


def test_events_names_the_address_it_cannot_listen_on(tmp_path):
    # A bare "[Errno -2] Name or service not known" before.
    assert _one_line(qag_cli("events", "--host", "nohost.invalid", "--port", "7621", home=str(tmp_path))) == \
        "qag: --host nohost.invalid: can't listen there (Name or service not known); use a host name or address " \
        "of this machine"
    assert _one_line(qag_cli("events", env={"QAG_EVENTS_HOST": "nohost.invalid", "QAG_EVENTS_PORT": "7621"},
                             home=str(tmp_path))).startswith("qag: QAG_EVENTS_HOST nohost.invalid: can't listen there")
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        port = taken.getsockname()[1]
        assert _one_line(qag_cli("events", "--port", str(port), home=str(tmp_path))) == \
            f"qag: --port {port}: the port is in use by another process on 127.0.0.1; pick another (0 = any free port)"
    finally:
        taken.close()


def test_events_host_set_but_empty_is_the_default_loopback(tmp_path):
    # QAG_EVENTS_HOST= listened on 0.0.0.0 and [::] before.
    full = {k: v for k, v in os.environ.items() if not k.startswith(("QAG_", "QUERYAPIGATE_"))}
    full.update({"QAG_HOME": str(tmp_path), "QAG_EVENTS_HOST": "", "QAG_EVENTS_PORT": "0"})
    proc = subprocess.Popen([sys.executable, "-m", "qag", "events"], env=full, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert re.match(r"qag events: listening at http://127\.0\.0\.1:\d+$", line.strip()), line
    finally:
        _stop(proc)


def test_a_second_server_on_a_running_servers_home_leaves_it_its_control_socket(tmp_path):
    # Two instances may share a home (its store); the second took over the first one's control socket before, and
    # removed it when it stopped: gunicornc and qag demo --reset then reached the wrong server, or none.
    proc, lines = _serve_until_listening(tmp_path, "--bind", ":0")
    try:
        assert lines and lines[-1].startswith("qag: listening on"), lines
        from qag.server import home_server
        wait_for(lambda: home_server(str(tmp_path)) is not None, "the server's control socket")
        second, second_lines = _serve_until_listening(tmp_path, "--bind", ":0")
        try:
            assert second_lines and second_lines[-1].startswith("qag: listening on"), second_lines
            assert (f"qag: a qag server (pid {proc.pid}) already runs on {tmp_path}: this one opens no control "
                    f"socket (gunicornc and qag demo --reset reach that one); give each instance a QAG_HOME of its "
                    f"own to control both") in second_lines, second_lines
            time.sleep(1.0)                                  # when gunicorn would have opened its socket
            assert home_server(str(tmp_path)) == proc.pid
        finally:
            _stop(second)
        assert home_server(str(tmp_path)) == proc.pid     # the first one's socket outlives the second
    finally:
        _stop(proc)


def test_demo_reset_refuses_while_a_server_runs_on_its_home(tmp_path):
    # The home of a running server was deleted under it before (D/gunicorn.ctl answering).
    proc, lines = _serve_until_listening(tmp_path, "--bind", ":0")
    try:
        assert lines and lines[-1].startswith("qag: listening on"), lines
        # gunicorn opens its control socket on its own schedule, after the listening line at times
        from qag.server import home_server
        wait_for(lambda: home_server(str(tmp_path)) is not None, "the server's control socket")
        r = qag_cli("demo", "--reset", "--home", str(tmp_path), "--bind", "127.0.0.1:0")
        line = _one_line(r)
        assert line == (f"qag: --reset: a qag server (pid {proc.pid}) is running on {tmp_path}; stop it first "
                        f"(Ctrl-C where it runs, or kill -TERM {proc.pid}), then run qag demo --reset again"), line
        assert (tmp_path / "qag.db").exists()
    finally:
        _stop(proc)
