"""qag's gunicorn worker: whole requests read without holding an app thread, QAG_THREADS threads run the app."""

from __future__ import annotations

import errno
import fcntl
import itertools
import logging
import os
import queue
import socket
import sys
import termios
import threading
import time
from collections import deque
from datetime import timedelta

from gunicorn.config import PostRequest, PreRequest
from gunicorn.workers import base

from .. import _speedups
from . import wsgi
from ..errors import QagError
from ..http11 import HttpError, Limits, Request
from .parser import parser_class
from .poller import STOP, make_poller


_DRAIN_SECONDS = 2.0   # how long a refused body is discarded before the connection is closed
_TIOCOUTQ = getattr(termios, "TIOCOUTQ", None)   # a socket's unsent bytes (Linux; elsewhere write events only)
# A stopping worker (reload, SIGTERM, max_requests) gives an idle kept-alive connection this long (at most its
# keep-alive deadline) for a last request, answered with Connection: close; a long keepalive must not stall the stop.
_STOP_IDLE_SECONDS = 1.0
# How long a connection the stopping worker half-closed discards what still arrives before it is closed.
_STOP_DRAIN_SECONDS = 1.0
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# Module globals, not module attributes: the compiled build reads a global from a cache, an attribute by a lookup
# (~250 instructions each, several per request).
_monotonic, _time = time.monotonic, time.time
_environ, _Response = wsgi.environ, wsgi.Response


class _Access:
    """What gunicorn's access log reads from a request (method, path, headers, version)."""

    __slots__ = ("method", "uri", "path", "query", "version", "headers")

    def __init__(self, req: Request, env: dict):
        self.method, self.uri, self.version, self.headers = req.method, req.uri, req.version, req.headers
        self.path, self.query = env.get("PATH_INFO"), env.get("QUERY_STRING")


class _Conn:
    """One client connection: its socket, its parser and the requests parsed but not yet answered."""

    __slots__ = ("sock", "fd", "client", "server", "base", "parser", "deadline", "started", "refusal", "in_app",
                 "closed", "lock", "draining", "unsent", "then_keep", "queued")

    def __init__(self, sock, client, server, base_env, parser):
        self.sock, self.client, self.server, self.base = sock, client, server, base_env
        self.fd = sock.fileno()
        self.in_app = False    # a pool thread owns it (reading or answering); the sweep must not close it
        self.closed = False
        self.draining = False  # answered 413 without reading the body: discard what still comes, then close
        self.lock = threading.Lock()   # in_app and closed change together (pool threads against the sweep)
        self.parser = parser
        self.deadline = 0.0
        self.started = False   # bytes of a request have arrived: the request deadline runs
        self.refusal: HttpError | None = None   # a bad request after pipelined good ones, answered after them
        # The rest of a whole response the socket had no room for (a view), sent as the client reads; the deadline
        # then bounds each part of it. then_keep: the answers so far let the connection go on once it is sent.
        # queued: what the kernel still held to send when the deadline was last set (_outq), so the sweep sees a
        # client that reads, though too slowly to leave room for a write event before the deadline.
        self.unsent = None
        self.then_keep = False
        self.queued = 0


def _outq(sock) -> int:
    """Bytes the kernel still holds to send on the socket (TIOCOUTQ); -1 where it can't say."""
    if _TIOCOUTQ is None:
        return -1
    try:
        return int.from_bytes(fcntl.ioctl(sock.fileno(), _TIOCOUTQ, b"\0\0\0\0"), sys.byteorder, signed=True)
    except OSError:
        return -1


class QagWorker(base.Worker):
    """gunicorn keeps the master, signals, reloads, max_requests and the timeout heartbeat; this class owns HTTP.

    The main thread accepts connections, closes the idle and the too-slow ones, and drives the heartbeat and the
    graceful stop. On epoll, QAG_THREADS pool threads wait on the connections themselves (one-shot): the thread
    that gets one reads and parses what has arrived (an incomplete request is re-armed at once, so a slow client
    never holds a thread), runs the app for each complete request and writes the answer, then re-arms it for
    keep-alive. An answer the socket can't take at once is kept on the connection, which is armed for room to
    write: a client that doesn't read holds no thread either. Without epoll the main thread reads and queues
    complete requests (and connections with room for their rest) to the pool instead."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        from qag.settings import load
        settings = load()
        self.limits = Limits(self.cfg.limit_request_line, self.cfg.limit_request_fields,
                             self.cfg.limit_request_field_size, settings.max_body_bytes)
        self.client_timeout = float(settings.client_timeout)
        self.spin = settings.spin_us / 1e6
        self.keepalive = float(self.cfg.keepalive)
        _speedups.check()
        self.parser_cls = parser_class()
        self.sort_fields = wsgi.fields_sorter()
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.returned: deque[_Conn] = deque()
        self.conns: set[_Conn] = set()
        self.poller = None
        self.answerer: _Answerer | None = None   # made when the worker runs (run())
        # Read once: each self.cfg.<name> is a lookup through gunicorn's Config.__getattr__. gunicorn's own hooks
        # only log at debug level or do nothing: then they are not called at all (a reload starts new workers).
        pre, post = self.cfg.pre_request, self.cfg.post_request
        if pre is PreRequest.default and not self.log.error_log.isEnabledFor(logging.DEBUG):
            pre = None
        self.pre_request = pre
        self.post_request = None if post is PostRequest.default else post
        self.log_access = True   # read from the logger once the worker runs (run())

    @classmethod
    def check_config(cls, cfg, log):
        if cfg.is_ssl:
            # refuse at startup rather than serve cleartext on a port configured for TLS
            raise RuntimeError("qag.worker.QagWorker does not terminate TLS: use --worker-class gthread "
                               "(QAG_WORKER_CLASS=gthread) or a TLS proxy in front")

    make_poller = staticmethod(make_poller)   # epoll where there is one; tests also run the selectors fallback

    # --- the main thread ----------------------------------------------------------------------------------
    def run(self) -> None:
        # gunicorn's property (Python code) computes it once per logger setup, which a reload repeats in new
        # workers: read once here instead of per request.
        self.log_access = getattr(self.log, "access_log_enabled", True)
        sel = self.poller = self.make_poller(self.spin)
        answerer = self.answerer = _Answerer(self)
        bases = {}
        for listener in self.sockets:
            listener.setblocking(False)
            name = listener.getsockname()
            bases[listener] = (name, wsgi.base_environ(self.cfg, name))
            sel.listen(listener, listener)
        sel.listen(self.PIPE[0], None)
        pool = answerer.follow if sel.followers else answerer.serve
        for _ in range(self.cfg.threads):
            threading.Thread(target=pool, name="qag-http", daemon=True).start()
        accepting = True
        next_sweep = 0.0
        last_notify = 0.0
        max_conns = self.cfg.worker_connections
        while self.alive:
            now = time.monotonic()
            if now - last_notify >= 0.5:
                self.notify()
                last_notify = now
                if self.ppid != os.getppid():
                    self.log.info("Parent changed, shutting down: %s", self)
                    break
            want = len(self.conns) < max_conns
            if want != accepting:
                for listener in self.sockets:
                    (sel.listen(listener, listener) if want else sel.unlisten(listener))
                accepting = want
            self._poll(sel, bases, 0.25)   # wakes for the sweep too: deadlines hold to ~0.25 s
            if now >= next_sweep:
                self._sweep(time.monotonic())
                next_sweep = now + 0.25
        self._shutdown(sel, bases)

    def _poll(self, sel, bases, timeout: float) -> None:
        for data in sel.select(timeout):
            if data is None:
                self._wake()
            elif type(data) is _Conn:
                self._readable(data)
            else:
                self._accept(data, bases[data])

    def _wake(self) -> None:
        try:
            while os.read(self.PIPE[0], 4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        returned = self.returned
        now = time.monotonic()
        while returned:
            conn = returned.popleft()
            if type(conn) is _Closed:
                self.conns.discard(conn.conn)
                continue
            if conn.unsent is not None:
                conn.in_app = False   # its deadline bounds the whole response (set when it was kept)
                self.poller.wants_room(conn)
                continue
            if not conn.draining:
                conn.started = conn.parser.partial
                conn.deadline = now + (self.client_timeout if conn.started else self.keepalive)
            conn.in_app = False
            self.poller.rearm(conn)

    def _accept(self, listener, server_base) -> int:
        """Accept up to 32 queued connections; how many were taken (fewer: the queue is empty)."""
        server, base_env = server_base
        for taken in range(32):
            try:
                sock, client = listener.accept()
            except (BlockingIOError, InterruptedError):
                return taken
            except OSError as exc:
                if exc.errno in (errno.ECONNABORTED, errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self.log.warning("accept failed: %s", exc)
                    return taken
                raise
            sock.setblocking(False)
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                # headers and body chunks go out as separate sends: don't let Nagle hold the second one back
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # the client's address goes into the connection's base environ once, not into every request's
            conn = _Conn(sock, client, server, wsgi.connection_environ(base_env, client),
                         self.parser_cls(self.limits))
            conn.deadline = time.monotonic() + self.keepalive
            self.conns.add(conn)
            self.poller.add(conn)
        return 32

    def _readable(self, conn: _Conn) -> None:
        """Selector thread (fallback): read; queue the connection to the pool when a request is complete, or when
        the socket has room for the rest of an answer."""
        if conn.unsent is not None or self.answerer.read(conn):
            self.poller.dispatched(conn)
            conn.in_app = True
            self.jobs.put(conn)

    def _sweep(self, now: float) -> None:
        """Close connections past their deadline: idle keep-alive ones, clients too slow to send a request, and
        clients too slow to take a whole answer."""
        # list(): a C-level copy, taken whole; pool threads remove closed connections from the set meanwhile
        for conn in [c for c in list(self.conns) if c.deadline < now and not c.in_app]:
            # (a connection in a pool thread is skipped: a stream's send timeout applies)
            self._close_idle(conn, now)

    def _close_idle(self, conn: _Conn, now: float) -> None:
        """Selector thread: close a connection no pool thread holds (checked under its lock), unless a request has
        arrived on it that no thread has read yet."""
        with conn.lock:
            if conn.in_app or conn.closed:
                return
            if not conn.started and not conn.draining and conn.unsent is None and _has_bytes(conn.sock):
                # Every pool thread was busy when it came: it is a request that has begun (a reset would drop it
                # unanswered), answered when a thread frees up, within the client timeout.
                conn.started = True
                conn.deadline = now + self.client_timeout
                return
            if conn.unsent is not None and 0 <= (queued := _outq(conn.sock)) < conn.queued:
                # The client took some of what the kernel held: it reads, just slowly. The time starts again.
                conn.queued = queued
                conn.deadline = now + self.client_timeout
                return
            conn.closed = True
        self.poller.remove(conn)
        self.answerer.close(conn)

    def _shutdown(self, sel, bases) -> None:
        """The graceful stop (a reload, SIGTERM, max_requests): no request taken is dropped, no client is reset.

        What the kernel already queued on the listener is accepted, then this worker's copy of the listener is
        closed: on a reload or a recycle the master's copy stays open and the other workers go on accepting; on a
        stop the listener is gone once the last worker closes it, so a late client is refused at once instead of
        queued for the whole stop and reset at its end. In-flight and half-read requests finish within the
        graceful timeout; a request arriving on a kept-alive connection is answered with Connection: close; an
        idle connection gets _STOP_IDLE_SECONDS (at most its keep-alive) for a last request, then a lingering
        close (_stop_sweep)."""
        for listener in self.sockets:
            try:
                sel.unlisten(listener)
            except (KeyError, ValueError, OSError):
                pass
        max_conns = self.cfg.worker_connections
        for listener in self.sockets:
            try:
                while len(self.conns) < max_conns and self._accept(listener, bases[listener]) == 32:
                    pass
            except OSError:
                pass
            listener.close()
        now = time.monotonic()
        idle_until = now + _STOP_IDLE_SECONDS
        deadline = now + self.cfg.graceful_timeout
        while self.conns and time.monotonic() < deadline:
            self.notify()
            self._poll(sel, bases, 0.1)
            self._stop_sweep(time.monotonic(), idle_until)
        for _ in range(self.cfg.threads):
            self.jobs.put(None)
        sel.stop()

    def _stop_sweep(self, now: float, idle_until: float) -> None:
        """Stopping: half-close each connection whose time is up (an idle one at idle_until at the latest), close
        each half-closed one whose drain is over. The deadlines are only read here: pool threads write them."""
        for conn in list(self.conns):
            if conn.in_app:
                continue
            due = conn.deadline if conn.started or conn.draining else min(conn.deadline, idle_until)
            if due < now:
                self._linger_close(conn, now, idle_until)

    def _linger_close(self, conn: _Conn, now: float, idle_until: float) -> None:
        """Selector thread, stopping: a lingering close. Closing a socket whose receive buffer holds bytes makes the
        kernel send a reset, which can destroy a response the client has not read yet; so the connection is
        half-closed (the client reads every response, then EOF) and what still arrives is discarded until the
        client closes or _STOP_DRAIN_SECONDS pass. Under the lock no pool thread reads it meanwhile."""
        with conn.lock:
            if conn.in_app or conn.closed:
                return
            if not conn.draining and conn.unsent is None:   # (a client too slow to take its answer is just closed)
                if (conn.deadline if conn.started else min(conn.deadline, idle_until)) >= now:
                    return   # a pool thread answered on it and re-armed it since the sweep looked
                try:
                    pending = conn.sock.recv(1, socket.MSG_PEEK)
                except (BlockingIOError, InterruptedError):
                    pending = None
                except OSError:
                    pending = b""
                if pending:
                    return   # a request is arriving: it is read and answered (with Connection: close) first
                if pending is None and self.answerer.half_close(conn, _STOP_DRAIN_SECONDS):
                    return
            conn.closed = True   # the client closed, the drain is over, or the socket is gone
        self.poller.remove(conn)
        self.answerer.close(conn)

    def handle_exit(self, sig, frame):
        # SIGTERM: finish what is in flight (the signal's wakeup fd makes select() return)
        self.alive = False

class _Answerer:
    """The pool threads' side of the worker: read a connection, answer its complete requests, re-arm or close it.

    What a request reads of the worker (the app, the poller, the hooks, the timeouts) is read once into this
    object's fields when the worker runs: in the compiled build an extension type (worker.pxd), so a request reads
    them as C fields, where the gunicorn worker's own attributes are instance-dict lookups. Only `alive` (set by
    gunicorn's signal handlers) is read from the worker each time."""

    __slots__ = ("worker", "poller", "log", "app", "sort_fields", "pre_request", "post_request", "log_access",
                 "client_timeout", "keepalive", "served", "max_requests", "wake_fd", "conns", "returned", "jobs")

    def __init__(self, worker: QagWorker):
        self.worker = worker
        self.poller = worker.poller
        self.log = worker.log
        self.app = worker.wsgi
        self.sort_fields = worker.sort_fields
        self.pre_request = worker.pre_request
        self.post_request = worker.post_request
        self.log_access = worker.log_access
        self.client_timeout = worker.client_timeout
        self.keepalive = worker.keepalive
        # Requests answered by this worker: next() on a C counter is atomic under the interpreter lock, so the pool
        # threads count without a lock of their own.
        self.served = itertools.count(1)
        self.max_requests = worker.max_requests
        self.wake_fd = worker.PIPE[1]
        self.conns = worker.conns
        self.returned = worker.returned
        self.jobs = worker.jobs

    def follow(self) -> None:
        """Pool thread on epoll: take a connection with bytes, read it, answer what is complete, re-arm it."""
        poller = self.poller
        answered = False
        while True:
            conn = poller.wait(1.0, answered)
            answered = conn is not None and conn is not STOP
            if conn is None:
                continue
            if conn is STOP:
                return
            try:
                with conn.lock:
                    if conn.closed:
                        continue
                    conn.in_app = True
                try:
                    if conn.unsent is not None:
                        self.flush(conn)
                    elif self.read(conn):
                        self.answer(conn)
                except Exception:
                    wsgi.log_error(self.log, "Error handling a connection")
                    self.unregister_close(conn)
            finally:
                poller.idle()

    def serve(self) -> None:
        """Pool thread on the selectors fallback: answer connections the selector thread queued."""
        jobs = self.jobs
        while True:
            conn = jobs.get()
            if conn is None:
                return
            if conn.unsent is not None:
                self.flush(conn)
            else:
                self.answer(conn)

    def read(self, conn: _Conn) -> bool:
        """Read and parse what has arrived; True when complete requests are ready (the caller answers them),
        otherwise the connection is re-armed or closed here."""
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            self.wait_more(conn)
            return False
        except OSError:
            data = b""
        if not data:
            self.unregister_close(conn)
            return False
        if conn.draining:
            self.wait_more(conn)   # discarded; the sweep closes it at its deadline
            return False
        parser = conn.parser
        if not conn.started:
            conn.started = True
            conn.deadline = _monotonic() + self.client_timeout
        try:
            parser.feed(data)
        except HttpError as exc:
            if not parser.ready:
                self.log_refusal(conn, exc)
            # answered after the good requests pipelined before it (if any), then the connection is closed
            conn.refusal = exc
            parser.dead = True
            return True
        if parser.ready:
            return True
        if parser.dead:
            self.unregister_close(conn)
            return False
        if parser.continue_due is not None:
            parser.continue_due = None
            try:
                conn.sock.send(_CONTINUE)
            except OSError:
                self.unregister_close(conn)
                return False
        self.wait_more(conn)
        return False

    def wait_more(self, conn: _Conn) -> None:
        conn.in_app = False
        self.poller.wants_more(conn)

    def log_refusal(self, conn: _Conn, exc: HttpError) -> None:
        addr = conn.client[0] if isinstance(conn.client, tuple) else conn.client
        self.log.warning("Invalid request from ip=%s: %s", addr, exc.message)

    def answer(self, conn: _Conn, keep: bool = True) -> None:
        """Answer the ready requests in order (and a refusal after them); then keep or close. An answer the socket
        can't take whole is kept on the connection (park), and this goes on when it is sent (flush, with `keep`)."""
        parser = conn.parser
        try:
            ready = parser.ready
            while ready and keep:
                keep = self.handle(conn, ready.popleft())
                if conn.unsent is not None:
                    break
        except Exception:
            wsgi.log_error(self.log, "Error handling request")
            keep = False
        if keep and conn.refusal is not None and conn.unsent is None:
            try:
                exc = conn.refusal
                conn.unsent = wsgi.send_now(conn.sock, wsgi.error_response(exc.status, exc.reason, exc.message))
            except wsgi.ClientGone:
                pass
            keep = False
        if conn.unsent is not None:
            # `keep` as the answers so far left it: once the rest is sent, answer() goes on with the requests
            # still ready and a refusal after them (a dead parser only ends the connection after those).
            self.park(conn, keep)
            return
        # A response that promised keep-alive keeps its connection even when the worker began to stop while it was
        # answered: the client may already be sending its next request, and a close would answer that with a
        # reset. The stop sweep waits a little for that request, which is answered with Connection: close.
        keep = keep and not parser.dead
        if keep and parser.continue_due is not None:
            # A pipelined request waits for its 100 Continue; read() sends it only when nothing was answered first.
            parser.continue_due = None
            try:
                conn.unsent = wsgi.send_now(conn.sock, _CONTINUE)
            except wsgi.ClientGone:
                keep = False
            if conn.unsent is not None:
                self.park(conn, keep)
                return
        if (conn.draining and conn.refusal is None) or parser.dead:
            # The client may still be sending the body we refused, or what follows a request we couldn't read:
            # closing now would reset the connection and could destroy the answers before they are read.
            # Half-close, discard what comes for a short while.
            keep = self.half_close(conn, _DRAIN_SECONDS)
        elif not keep and not self.worker.alive:
            # Stopping: a lingering close too (a client may have sent more than it was answered).
            keep = self.half_close(conn, _STOP_DRAIN_SECONDS)
        if self.poller.followers:
            if keep:
                if not conn.draining:
                    conn.started = conn.parser.partial
                    conn.deadline = _monotonic() + (self.client_timeout if conn.started else self.keepalive)
                self.wait_more(conn)
            else:
                self.unregister_close(conn)
            return
        if keep:
            self.returned.append(conn)
        else:
            try:
                conn.sock.close()
            except OSError:
                pass
            self.returned.append(_Closed(conn))
        try:
            os.write(self.wake_fd, b".")
        except OSError:
            pass

    def park(self, conn: _Conn, keep: bool) -> None:
        """Keep the rest of an answer on the connection and give the thread back: the client has the client timeout
        to take each part of it (flush starts the time again on progress; the sweep closes it past that), then
        `keep` says whether the answers so far let the connection go on."""
        conn.then_keep = keep
        conn.deadline = _monotonic() + self.client_timeout
        conn.queued = _outq(conn.sock)
        self.wait_room(conn)

    def wait_room(self, conn: _Conn) -> None:
        if not self.poller.followers:
            self.returned.append(conn)   # the selector thread arms it (_wake)
            try:
                os.write(self.wake_fd, b".")
            except OSError:
                pass
            return
        with conn.lock:   # armed before the sweep may close it: an event then finds it closed, never a reused fd
            if conn.closed:
                return
            conn.in_app = False
            self.poller.wants_room(conn)

    def flush(self, conn: _Conn) -> None:
        """The socket has room: send more of the kept answer; once it is all sent, go on as after an answer."""
        unsent = conn.unsent
        try:
            rest = wsgi.send_now(conn.sock, unsent)
        except wsgi.ClientGone:
            conn.unsent = None
            self.answer(conn, False)
            return
        if rest is not None:
            if len(rest) < len(unsent):
                # progress: the client is reading, and has the client timeout again for the next part (a large
                # answer to a slow but steady reader is never cut; one that stops reading is, holding no thread)
                conn.deadline = _monotonic() + self.client_timeout
                conn.queued = _outq(conn.sock)
            conn.unsent = rest
            self.wait_room(conn)
            return
        conn.unsent = None
        self.answer(conn, conn.then_keep)

    def handle(self, conn: _Conn, req: Request) -> bool:
        """Answer one request; True when the connection stays open for the next."""
        started = _time()
        worker = self.worker
        if next(self.served) >= self.max_requests and worker.alive:
            self.log.info("Autorestarting worker after current request.")
            worker.alive = False
            os.write(self.wake_fd, b".")
        env = _environ(req, conn.base, conn.client, conn.server)
        env["gunicorn.socket"] = conn.sock   # as gthread gives it: a long stream bounds its own send buffer
        resp = _Response(conn.sock, req, self.client_timeout,
                         req.keep_alive and worker.alive and self.keepalive > 0, self.sort_fields)
        result = None
        if req.over_limit:
            conn.draining = True
        log_access = self.log_access
        pre_request, post_request = self.pre_request, self.post_request
        access = (_Access(req, env) if pre_request is not None or post_request is not None or log_access
                  else None)
        try:
            if pre_request is not None:
                pre_request(worker, access)
            try:
                writer = resp   # untyped: the bound start_response the app is given (the compiled resp is typed)
                result = self.app(env, writer.start_response)
                if resp.status is None and type(result) is not list:
                    # a generator app calls start_response on its first item
                    iterator = iter(result)
                    first = next(iterator, None)
                    _stream(resp, first, iterator)
                elif type(result) is list and not resp.headers_sent:
                    unsent = resp.write_whole(b"".join(result) if len(result) != 1 else result[0])
                    if unsent is not None:
                        conn.unsent = unsent   # sent as the client reads, by whichever thread then has it
                else:
                    _stream(resp, None, iter(result) if not resp.no_body else iter(()))
                resp.finish()
            except wsgi.ClientGone:
                resp.close = True
            except Exception as exc:
                resp.close = True
                if resp.headers_sent:
                    if isinstance(exc, QagError):
                        # The app's own refusal once the body had begun (a database that failed mid-stream): the
                        # run is recorded with its code and the outage logged by the app, the cut body tells the
                        # client; a traceback a stream would say nothing more.
                        self.log.warning("%s %s: the body ended early (%s %s)", req.method, req.uri, exc.status,
                                         exc.code)
                    else:
                        wsgi.log_error(self.log, f"Error handling request {req.method} {req.uri}")
                else:
                    wsgi.log_error(self.log, f"Error handling request {req.method} {req.uri}")
                    resp.status, resp.code = "500 Internal Server Error", 500
                    try:
                        conn.unsent = wsgi.send_now(conn.sock, wsgi.error_response(500, "Internal Server Error", ""))
                    except wsgi.ClientGone:
                        pass
            finally:
                if result is not None and type(result) is not list and hasattr(result, "close"):
                    try:
                        result.close()
                    except Exception:
                        wsgi.log_error(self.log, "Error closing the response iterable")
        finally:
            if log_access:
                elapsed = timedelta(seconds=_time() - started)
                self.log.access(resp, access, env, elapsed)
            if post_request is not None:
                try:
                    post_request(worker, access, env, resp)
                except Exception:
                    wsgi.log_error(self.log, "Exception in post_request hook")
        return not resp.close

    def unregister_close(self, conn: _Conn) -> None:
        """Whichever thread holds the connection: close it."""
        with conn.lock:
            if conn.closed:
                return
            conn.closed = True
        self.poller.remove(conn)
        self.close(conn)

    def close(self, conn: _Conn) -> None:
        conn.closed = True
        self.conns.discard(conn)
        try:
            conn.sock.close()
        except OSError:
            pass

    def half_close(self, conn: _Conn, seconds: float) -> bool:
        """Send FIN after what was answered and discard what still arrives for `seconds` (conn.draining: read
        drops it, the sweep closes the connection at its deadline); False when the socket is already gone."""
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            conn.draining = False
            return False
        conn.draining = True
        conn.deadline = _monotonic() + seconds
        return True


def _stream(resp, first, iterator) -> None:
    """Write a body the app gives as an iterable, item by item (its first item already taken when it is a generator
    whose first step starts the response)."""
    if first is not None:
        resp.write(first)
    if resp.no_body:
        return   # HEAD, 204, 304: the body is never produced (a stream's close() releases its cursor)
    for item in iterator:
        resp.write(item)


def _has_bytes(sock) -> bool:
    """Whether bytes (not just the end) wait unread on the socket; looked at without waiting."""
    try:
        return bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except OSError:
        return False


class _Closed:
    """A connection a pool thread closed: the selector thread only forgets it."""

    __slots__ = ("conn",)

    def __init__(self, conn):
        self.conn = conn
