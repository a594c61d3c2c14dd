"""The `qag` command: serve, demo, init, version, config, check, store copy, and connections/queries/keys administration."""

from __future__ import annotations

import argparse
import errno
import json
import os
import secrets
import shutil
import sys

from .version import __version__
from .errors import QagError
from .settings import SettingsError, load
from .store import StoreOpenError

# `qag init` seeds these inactive templates, to be edited and activated (passwords by reference, never stored).
INIT_TEMPLATES = (
    {"name": "example-sqlite", "db": "sqlite", "database": "example.db"},
    {"name": "example-postgres", "db": "postgres", "host": "localhost", "port": 5432, "database": "postgres",
     "user": "postgres", "password": "${POSTGRES_PASSWORD}"},
    {"name": "example-mysql", "db": "mysql", "host": "localhost", "port": 3306, "database": "mysql",
     "user": "root", "password": "${MYSQL_PASSWORD}"},
)
CLI_USAGE_ERROR = 2
CLI_OPERATION_ERROR = 1


def _err(message: str) -> None:
    print(f"qag: {message}", file=sys.stderr)


def _print(value) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False))


# --- commands --------------------------------------------------------------------------------------------
def cmd_version(args, settings) -> int:
    from . import _speedups
    warning = _speedups.check()   # refuses under QAG_SPEEDUPS=require, in one line, unless all is compiled
    chosen = ", ".join(f"{name}={kind}" for name, kind in _speedups.choices().items())
    print(f"qag {__version__} (speedups {_speedups.mode()}: {chosen})")
    if warning:
        _err(f"warning: {warning}")
    return 0


def cmd_init(args, settings) -> int:
    from .store import open_store
    store = open_store(settings)
    if store.get_meta("mask_key") is None:
        store.set_meta("mask_key", secrets.token_hex(32))
    if store.list_connections():
        print(f"qag: {store.describe()} already has connections - left untouched", file=sys.stderr)
        return 0
    from .testing import Client
    admin = Client(settings)
    for template in INIT_TEMPLATES:
        admin.manage("POST", "/api/v1/connections", dict(template, active=False))
    print(f"qag home ready: {store.describe()} (inactive template connections: "
          f"{', '.join(t['name'] for t in INIT_TEMPLATES)})", file=sys.stderr)
    return 0


def cmd_store(args, settings) -> int:
    """qag store copy: every table of one store into an empty other one."""
    from .store import open_store
    from .store.copy import copy_store, is_url, sqlite_home
    source_text = args.source if args.source is not None else settings.home
    target_text = args.target if args.target is not None else settings.database_url
    if not target_text:
        _err("store copy needs --to (a postgresql:// URL or a folder) or QAG_DATABASE_URL")
        return CLI_USAGE_ERROR
    # Only a store that exists already is read: a mistyped --from must not create an empty one.
    # A whole table is one statement (and one COPY): a big store's take longer than a request's limit.
    settings = settings.with_overrides(store_timeout=0)
    source_from = "--from" if args.source is not None else "QAG_HOME"
    target_from = "--to" if args.target is not None else "QAG_DATABASE_URL"
    source = (open_store(settings, url=source_text, setting=source_from) if is_url(source_text)
              else open_store(settings, home=sqlite_home(source_text), setting=source_from))
    target = (open_store(settings, url=target_text, setting=target_from) if is_url(target_text)
              else open_store(settings, home=target_text, setting=target_from))
    if source.describe() == target.describe():
        _err("the source and the target are the same store")
        return CLI_USAGE_ERROR
    try:
        counts = copy_store(source, target)
    finally:
        source.close()
        target.close()
    for table, n in counts.items():
        print(f"{table}\t{n}")
    print(f"qag: copied {sum(counts.values())} rows from {source.describe()} to {target.describe()}", file=sys.stderr)
    return 0


def _shown(setting, value) -> str:
    """A setting's value as `qag config` prints it: secrets masked, passwords out of URLs."""
    if value is None or value == ():
        return "unset"
    if setting.name in ("QAG_DATABASE_URL", "QAG_REDIS_URL"):
        from .store.postgres import redact
        return redact(value)   # where the store is helps; only the password is the secret
    if setting.secret:
        return "********"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    return str(value)


def cmd_config(args, settings) -> int:
    """qag config: every setting's effective value and where it came from (a flag, a variable, the default)."""
    from .settings import sources
    flags = {env: f"--{attr}" for attr, env in _FLAG_ENV.items() if getattr(args, "flags_set", {}).get(attr)}
    rows = [(s.name, _shown(s, settings.values[s.attr]),
             flags.get(s.name) or source or ("derived" if s.default is None and settings.values[s.attr] is not None
                                             else "default"))
            for s, source in sources()]
    if args.json:
        print(json.dumps({name: {"value": value, "from": source} for name, value, source in rows}, indent=2))
        return 0
    width = max(len(name) for name, _, _ in rows)
    for name, value, source in rows:
        print(f"{name:<{width}}  {value}  ({source})")
    return 0


def cmd_check(args, settings) -> int:
    """qag check: the settings (already loaded), the store opened as `qag serve` opens it, and every active saved
    connection tested with a fresh connection; one line each, exit 0 when all pass, 1 otherwise."""
    from .backends.base import resolve_fields
    from .backends.registry import Backends
    from .server import check_startup
    from .store import open_store
    from .store.sqlite import store_paths
    check_startup(settings)
    store = open_store(settings)
    try:
        rows = store.list_connections()
    finally:
        store.close()
    backends = Backends(settings, store_paths(settings.home))
    failed = 0
    for row in rows:
        name, db = row["name"], row["db"]
        if not row.get("active", True):
            print(f"skip  {name} ({db}): inactive")
            continue
        try:
            elapsed = backends.get(db).test(resolve_fields(row["fields"], os.environ))
        except QagError as exc:
            failed += 1
            print(f"FAIL  {name} ({db}): {exc.status} {exc.code}: {exc.extras.get('detail') or exc.message}")
            continue
        print(f"ok    {name} ({db}) {elapsed:.1f} ms")
    backends.close_idle()
    print(f"qag check: settings ok, store ok, {len(rows) - failed} of {len(rows)} connections ok"
          if not failed else f"qag check: {failed} of {len(rows)} connections failed", file=sys.stderr)
    return CLI_OPERATION_ERROR if failed else 0


def cmd_serve(args, settings) -> int:
    from .server import serve
    return serve(settings)


def cmd_events(args, settings) -> int:
    """qag events: the standalone SSE server (contract 8.6) on this home's store."""
    import asyncio
    from .auth import Authenticator
    from .observe.events_server import EventsServer
    from .store import open_store
    store = open_store(settings)
    token = settings.metrics_token.encode("utf-8") if settings.metrics_token is not None else None
    server = EventsServer(settings, store, Authenticator(store, settings.api_key, settings), token)
    host = args.host.strip() if args.host and args.host.strip() else settings.events_host
    port = args.port if args.port is not None else settings.events_port
    listening = []
    try:
        asyncio.run(server.serve(host, port, ready=listening.append))
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        if listening:
            raise
        # Before it listened: the address, named by where it came from, not the socket's bare error.
        if exc.errno == errno.EADDRINUSE:
            where = f"--port {port}" if args.port is not None else f"QAG_EVENTS_PORT {port}"
            _err(f"{where}: the port is in use by another process on {host}; pick another (0 = any free port)")
        else:
            where = f"--host {host}" if args.host and args.host.strip() else f"QAG_EVENTS_HOST {host}"
            _err(f"{where}: can't listen there ({exc.strerror or exc}); use a host name or address of this machine")
        return CLI_USAGE_ERROR
    finally:
        store.close()
    return 0


def cmd_mcp(args, settings) -> int:
    """qag mcp: the MCP server over stdio, one JSON-RPC message a line, each answered by the gateway's own POST /mcp
    (so a stdio tool call has /mcp's auth, grants, limits, quota and history) as the QAG_MCP_API_KEY caller."""
    import io
    from .app import create_app
    app = create_app(settings)
    key = settings.mcp_api_key or settings.api_key
    out = sys.stdout.buffer
    try:
        for line in sys.stdin.buffer:
            if not line.strip():
                continue
            # A loopback peer addressing localhost: what open mode (no key anywhere) lets in.
            environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/mcp", "QUERY_STRING": "", "SERVER_NAME": "localhost",
                       "SERVER_PORT": "0", "SERVER_PROTOCOL": "HTTP/1.1", "HTTP_HOST": "localhost",
                       "REMOTE_ADDR": "127.0.0.1", "CONTENT_TYPE": "application/json",
                       "CONTENT_LENGTH": str(len(line)), "wsgi.input": io.BytesIO(line), "wsgi.url_scheme": "http",
                       "wsgi.errors": sys.stderr}
            if key:
                environ["HTTP_X_API_KEY"] = key
            body = b"".join(app(environ, lambda status, headers, exc_info=None: None))
            if body.strip():   # 202 (a notification) has no answer; stdout carries nothing but messages
                out.write(body.rstrip(b"\n") + b"\n")
                out.flush()
    except KeyboardInterrupt:
        pass
    finally:
        app.close()
    return 0


def cmd_demo(args, settings) -> int:
    from . import demo
    from .server import serve
    from .server import binds_problem, home_server
    problem = binds_problem(settings, "qag demo")
    if problem is not None:   # before the first run's minutes of preparation, not after
        _err(problem)
        return CLI_USAGE_ERROR
    home = os.path.abspath(args.home.strip() if args.home and args.home.strip() else settings.demo_home)
    demo_settings = settings.with_overrides(home=home, api_key=None)
    pid = home_server(home) if args.reset else None
    if pid is not None:
        # Deleting the home would take the store and keys from under it: it would go on serving a deleted file.
        _err(f"--reset: a qag server{f' (pid {pid})' if pid else ''} is running on {home}; stop it first (Ctrl-C "
             f"where it runs{f', or kill -TERM {pid}' if pid else ''}), then run qag demo --reset again")
        return CLI_USAGE_ERROR
    if args.reset or not os.path.exists(os.path.join(home, demo.KEYS_FILE)):
        # Not on make demo's restart onto the compiled build (build_backend/demo.py): the home is there already.
        print("qag demo: preparing the demo home (first run generates ~90,000 rows)...", file=sys.stderr)
    if args.reset and os.path.isdir(home):
        # Before any store is opened there: one opened first would be deleted under the admin writing to it.
        shutil.rmtree(home)
    from .store import open_store
    # Opened once here so a home that cannot be made is refused naming where it came from, not QAG_HOME.
    open_store(demo_settings, home=home, setting="--home" if args.home else "QAG_DEMO_HOME").close()
    from .testing import Client
    keys = demo.prepare_home(home, False, Client(demo_settings).manage)
    os.environ["QAG_HOME"] = home
    os.environ["QAG_API_KEY"] = keys["admin_key"]
    for alias in ("QUERYAPIGATE_HOME", "QUERYAPIGATE_API_KEY", "QAG_API_KEY_FILE", "QUERYAPIGATE_API_KEY_FILE"):
        os.environ.pop(alias, None)
    final = load()
    # The banner comes when the server listens, with its real port (--bind 127.0.0.1:0 too); a taken port is
    # said before it, once.
    return serve(final, lambda url: demo.banner(url, keys, home), "qag demo")


def _grant_list(text: str | None):
    if text is None:
        return None
    return "*" if text.strip() == "*" else [p.strip() for p in text.split(",") if p.strip()]


_SINGULAR = {"connections": "connection", "queries": "query", "keys": "key"}


def cmd_admin(args, settings) -> int:
    from .testing import Client
    admin = Client(settings)
    resource, action = args.command, args.action
    base = {"connections": "/api/v1/connections", "queries": "/api/v1/queries", "keys": "/api/v1/api-keys"}[resource]
    if action == "list":
        for item in admin.manage("GET", base)["items"]:
            print(item["name"])
        return 0
    target = f"{base}/{args.name}"
    if action == "show":
        _print(admin.manage("GET", target))
        return 0
    if action == "remove":
        admin.manage("DELETE", target, {"reason": args.reason} if resource == "connections" else None)
        print(f"removed {_SINGULAR[resource]} '{args.name}'", file=sys.stderr)
        return 0
    if resource == "connections":
        body = {"name": args.name, "db": args.db}
        for field in ("host", "port", "database", "user", "password"):
            if getattr(args, field) is not None:
                body[field] = getattr(args, field)
        port = body.get("port")
        if port is not None:   # the connection's own port (never QAG_BIND): a number, or a ${VARIABLE} it reads
            if port.strip().isascii() and port.strip().isdigit():
                body["port"] = int(port)
            elif not (port.startswith("${") and port.endswith("}")):
                _err(f"--port must be the database server's port, a number from 1 to 65535 (or a ${{VARIABLE}} "
                     f"naming one), not {port!r}")
                return CLI_USAGE_ERROR
        body["options"] = {}
        for option in args.option or []:
            name, sep, value = option.partition("=")
            if not sep or not name.strip():   # the text itself is not shown: it could be a password
                _err("--option takes KEY=VALUE (e.g. --option sslmode=require); one of them has no KEY=")
                return CLI_USAGE_ERROR
            body["options"][name.strip()] = value
    elif resource == "queries":
        body = {"name": args.name, "description": args.description, "sql": args.sql, "publish": args.publish}
        if args.connection:
            body["connection_name"] = args.connection
        if args.parameters:
            try:
                body["parameters"] = json.loads(args.parameters)
            except ValueError as exc:
                _err(f"--parameters must be a JSON object of parameter rules, e.g. "
                     f"'{{\"id\": {{\"type\": \"integer\"}}}}'; this is not JSON "
                     f"({getattr(exc, 'msg', 'unreadable')} at character {getattr(exc, 'pos', 0) + 1})")
                return CLI_USAGE_ERROR
            if not isinstance(body["parameters"], dict):
                _err(f"--parameters must be a JSON object of parameter rules, e.g. "
                     f"'{{\"id\": {{\"type\": \"integer\"}}}}', not a JSON {type(body['parameters']).__name__}")
                return CLI_USAGE_ERROR
    else:
        body = {"name": args.name}
        if args.role:
            body["role"] = args.role
        for field in ("connections", "queries"):
            value = _grant_list(getattr(args, field))
            if value is not None:
                body[field] = value
        if args.expires:
            body["expires_at"] = args.expires
    created = admin.manage("POST", base, body)
    if resource == "keys":
        print(f"API key '{args.name}' created. Its secret is shown once; store it now:", file=sys.stderr)
        print(created["secret"])
    else:
        print(f"created {_SINGULAR[resource]} '{args.name}'", file=sys.stderr)
    return 0


# --- parser ----------------------------------------------------------------------------------------------
def _port(text: str) -> int:
    """A TCP port argument: argparse's one-line refusal (exit 2) rather than a traceback from bind()."""
    word = text.strip()
    if not (word.isascii() and word.lstrip("+-").isdigit()):   # int() takes "٥٠٠٠" and "5_000"; "²" passes isdigit()
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}")
    port = int(word)
    if not 0 <= port < 65536:   # 0: any free port (the tests' servers take one so)
        raise argparse.ArgumentTypeError(f"a port is from 0 to 65535, not {port}")
    return port


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qag", description="Saved SQL queries served as governed HTTP APIs.")
    parser.add_argument("--version", action="version", version=f"qag {__version__}")
    sub = parser.add_subparsers(dest="command")

    serve = sub.add_parser("serve", help="run the gateway under gunicorn (the default command)",
                           epilog="Every setting is an environment variable (QAG_*, or QueryAPIGate's QUERYAPIGATE_* "
                                  "names): see docs/configuration.md, and `qag config` for the values in effect.")
    serve.add_argument("--bind", help="host:port to listen on (QAG_BIND)")
    serve.add_argument("--host", help="host to listen on (with --port; QAG_BIND wins when both are given)")
    serve.add_argument("--port", type=_port, help="port to listen on")
    serve.add_argument("--workers", type=int, help="worker processes (QAG_WORKERS)")
    serve.add_argument("--threads", type=int, help="threads per worker (QAG_THREADS)")
    serve.add_argument("--home", help="folder of the store (QAG_HOME)")

    demo = sub.add_parser("demo", help="serve the embedded demo: example shop data, saved queries and keys")
    demo.add_argument("--reset", action="store_true", help="delete the demo home and start over")
    demo.add_argument("--home", help="demo home folder (default ./demo-home)")
    demo.add_argument("--bind", help="host:port to listen on (default 127.0.0.1:5000)")

    init = sub.add_parser("init", help="create a home with an empty store and a masking key")
    init.add_argument("--home", help="folder of the store (QAG_HOME)")

    sub.add_parser("version", help="print the version and which twin of each compiled module runs")
    sub.add_parser("mcp", help="serve MCP over stdio (for an agent that starts qag itself) as QAG_MCP_API_KEY: "
                               "the same tools and governance as /mcp")
    config = sub.add_parser("config", help="print every setting's effective value (secrets masked) and its source")
    config.add_argument("--json", action="store_true", help="as a JSON object")
    config.add_argument("--home", help="folder of the store (QAG_HOME)")
    check = sub.add_parser("check", help="validate the settings, open the store and test every connection "
                                         "(exit 0 when all pass, 1 otherwise)")
    check.add_argument("--home", help="folder of the store (QAG_HOME)")

    events = sub.add_parser("events", help="serve GET /events to many clients, with every instance's runs and "
                                           "resume (Last-Event-ID); run beside `qag serve` on the same store")
    events.add_argument("--host", help="host to listen on (QAG_EVENTS_HOST)")
    events.add_argument("--port", type=_port, help="port to listen on (QAG_EVENTS_PORT)")
    events.add_argument("--home", help="folder of the store (QAG_HOME)")

    store = sub.add_parser("store", help="store maintenance")
    store_actions = store.add_subparsers(dest="action", required=True)
    copy = store_actions.add_parser("copy", help="copy every table into an empty store (SQLite <-> PostgreSQL)")
    copy.add_argument("--from", dest="source", help="a postgresql:// URL or a folder holding qag.db "
                      "(default: the SQLite store in QAG_HOME)")
    copy.add_argument("--to", dest="target", help="a postgresql:// URL or a folder (default: QAG_DATABASE_URL; "
                      "prefer it, or QAG_DATABASE_URL_FILE, to a password on the command line)")
    copy.add_argument("--home", help="folder of the SQLite store (QAG_HOME)")
    sub.add_parser("size", help="workers and threads for a load (see qag size --help)", add_help=False)

    for resource in ("connections", "queries", "keys"):
        res = sub.add_parser(resource, help=f"administer {resource} in the store directly")
        res.add_argument("--home", help="folder of the store (QAG_HOME)")
        actions = res.add_subparsers(dest="action", required=True)
        # --home is accepted after the action too (`qag keys list --home DIR`).
        home_too = argparse.ArgumentParser(add_help=False)
        home_too.add_argument("--home", default=argparse.SUPPRESS, help="folder of the store (QAG_HOME)")
        actions.add_parser("list", help=f"list {resource}", parents=[home_too])
        for action in ("show", "remove"):
            p = actions.add_parser(action, help=f"{action} one", parents=[home_too])
            p.add_argument("name")
            if action == "remove" and resource == "connections":
                p.add_argument("--reason", required=True, help="why it is deleted (kept in the audit log)")
        add = actions.add_parser("add", help="create one", parents=[home_too])
        add.add_argument("name")
        if resource == "connections":
            add.add_argument("--db", required=True, choices=("sqlite", "mysql", "postgres"))
            for field in ("host", "port", "database", "user", "password"):
                add.add_argument(f"--{field}")
            add.add_argument("--option", action="append", metavar="KEY=VALUE", help="driver option (repeatable)")
        elif resource == "queries":
            add.add_argument("--sql", required=True)
            add.add_argument("--description", required=True)
            add.add_argument("--connection", help="default connection name")
            add.add_argument("--parameters", help="parameter rules as a JSON object")
            add.add_argument("--publish", action="store_true", help="publish version 1 at once")
        else:
            add.add_argument("--connections", help="'*' or a comma list (default '*')")
            add.add_argument("--queries", help="'*' or a comma list of saved queries")
            add.add_argument("--role", help="copy the grants of this role")
            add.add_argument("--expires", help="last valid day, YYYY-MM-DD")
    return parser


_FLAG_ENV = {"bind": "QAG_BIND", "workers": "QAG_WORKERS", "threads": "QAG_THREADS", "home": "QAG_HOME"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["size"]:
        # `qag size` has its own parser and needs no settings, store or server.
        from .sizing import main as size_main
        return size_main(argv[1:])
    args = build_parser().parse_args(argv)
    command = args.command or "serve"
    if args.command is None:
        args = build_parser().parse_args(["serve"])
    # Flags become the environment, so gunicorn's workers see exactly what the master validated.
    # serve's --host/--port only: `qag events` and `qag connections add` have their own, which are not QAG_BIND.
    host, port = getattr(args, "host", None), getattr(args, "port", None)
    if command == "serve" and (host or port is not None) and not args.bind:
        host = (host or "").strip() or "127.0.0.1"
        args.bind = f"{f'[{host}]' if ':' in host and not host.startswith('[') else host}:" \
                    f"{port if port is not None else 5000}"
    args.flags_set = {}
    for attr, env in _FLAG_ENV.items():
        value = getattr(args, attr, None)
        if value is not None and not (command == "demo" and attr == "home"):
            os.environ[env] = str(value)
            args.flags_set[attr] = True
    try:
        settings = load()
        handler = {"serve": cmd_serve, "demo": cmd_demo, "init": cmd_init, "version": cmd_version,
                   "store": cmd_store, "events": cmd_events, "config": cmd_config, "check": cmd_check,
                   "mcp": cmd_mcp}.get(
            command, cmd_admin)
        return handler(args, settings)
    except (SettingsError, StoreOpenError) as exc:
        _err(str(exc))
        # `qag check` answers 0 or 1 only (PostgREST's --ready): a readiness probe reads the status alone.
        return CLI_OPERATION_ERROR if command == "check" else CLI_USAGE_ERROR
    except QagError as exc:
        _err(f"{exc.message} ({exc.code})")
        return CLI_OPERATION_ERROR
    except (ImportError, RuntimeError, OSError, ValueError) as exc:
        _err(str(exc))
        return CLI_OPERATION_ERROR


if __name__ == "__main__":
    raise SystemExit(main())
