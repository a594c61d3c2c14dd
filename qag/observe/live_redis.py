"""Live run events across instances through Redis (QAG_REDIS_URL): every instance's runs on every instance's
GET /events streams.

While some instance holds a stream, it keeps the key LISTENERS alive in Redis (a few seconds' TTL, renewed), and
one worker of that host (the ring's relay, taken over when it dies) subscribes to CHANNEL and puts every other
instance's event into its host's ring, where its streams read it like a local one. Every worker looks at
LISTENERS once a second (first as its publisher thread starts, on its first run); while it is there, and until that
first look, a run's event is also handed to a publisher thread (a bounded queue: the call never waits for Redis)
that PUBLISHes it with its instance's id, so no instance reads its own events twice; what was handed over before
a look that finds no listener is dropped. Redis down: events stay on their own host, and the threads try again
after a pause.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time

log = logging.getLogger("qag")

CHANNEL = "events"                 # both after the deployment's prefix (SharedRedis.prefix)
LISTENERS = "events:listeners"
LISTENERS_TTL = 10          # seconds the key lives without a renewal (an instance that died stops it)
RENEW = 3.0                 # seconds between renewals by a host that holds streams
LOOK = 1.0                  # seconds between two looks at LISTENERS by a worker
QUEUE = 10_000              # events waiting for the publisher before the oldest are dropped


class Relay:
    """One per worker."""

    def __init__(self, url: str, prefix: str = "qag:"):
        self.url = url
        self.channel, self.listeners = prefix + CHANNEL, prefix + LISTENERS
        # Whether some instance holds a stream, as the publisher thread last saw LISTENERS; None until its first look
        # (a worker's first runs are offered, not lost: the look that follows publishes them or drops them).
        self._remote: bool | None = None
        self._queue: collections.deque = collections.deque(maxlen=QUEUE)
        self._wake = threading.Event()
        self._pid = None
        self._relaying = False
        self._lock = threading.Lock()
        self.dropped = 0

    def _client(self, timeout: float = 1.0):
        import redis
        return redis.Redis.from_url(self.url, socket_connect_timeout=timeout, socket_timeout=timeout,
                                    health_check_interval=0, retry_on_timeout=False)

    def _start(self) -> None:
        """The publisher thread of this process (again after a fork)."""
        if self._pid == os.getpid():
            return
        with self._lock:
            if self._pid != os.getpid():
                self._pid = os.getpid()
                self._relaying = False
                self._remote = None   # this process has not looked yet (a forked one inherits its parent's view)
                self._queue.clear()
                threading.Thread(target=self._publish_loop, name="qag-live-redis", daemon=True).start()

    # --- publishing (request threads hand over; one thread talks to Redis) --------------------------------
    @property
    def remote_listeners(self) -> bool:
        """Some instance holds a stream (as the publisher thread last saw LISTENERS, or it has not looked yet);
        starts that thread."""
        if self._pid != os.getpid():
            self._start()
        return self._remote is not False

    def offer(self, instance: int, record: bytes) -> None:
        if len(self._queue) == QUEUE:
            self.dropped += 1
        self._queue.append(b"%x\n" % instance + record)
        self._wake.set()

    def _publish_loop(self) -> None:
        # The first look is at once: until it, every run is offered (remote_listeners), and a worker's first
        # second of runs must reach the other instances' streams when there are some.
        client = None
        looked = -LOOK
        while True:
            try:
                if client is None:
                    client = self._client()
                now = time.monotonic()
                if now - looked >= LOOK:
                    looked = now
                    self._remote = bool(client.exists(self.listeners))
                    if not self._remote:
                        self._queue.clear()   # offered before the look said no instance listens
                if self._queue:
                    pipe = client.pipeline(transaction=False)
                    while self._queue:
                        pipe.publish(self.channel, self._queue.popleft())
                    pipe.execute()
            except Exception:   # Redis down: events stay on their host; look again after a pause
                client = None
                self._remote = False
                self._queue.clear()
                time.sleep(LOOK)
            self._wake.wait(LOOK)
            self._wake.clear()

    # --- relaying (the host's one subscriber) -------------------------------------------------------------
    def host_listens(self, ring) -> None:
        """A stream opened on this host: this process relays other instances' events into the ring unless a
        live process of the host already does."""
        self._start()
        with self._lock:
            if self._relaying or not ring.claim_relay(os.getpid()):
                return
            self._relaying = True
        threading.Thread(target=self._relay_loop, args=(ring,), name="qag-live-relay", daemon=True).start()

    def _relay_loop(self, ring) -> None:
        pid = os.getpid()
        own = b"%x" % ring.instance
        try:
            while ring.listening():
                pubsub = None
                try:
                    client = self._client(timeout=5.0)
                    pubsub = client.pubsub(ignore_subscribe_messages=True)
                    pubsub.subscribe(self.channel)
                    renewed = 0.0
                    while ring.listening():
                        now = time.monotonic()
                        if now - renewed >= RENEW:
                            client.set(self.listeners, b"1", ex=LISTENERS_TTL)
                            renewed = now
                        message = pubsub.get_message(timeout=0.5)
                        if message is None or message.get("type") != "message":
                            continue
                        instance, _, record = message["data"].partition(b"\n")
                        if instance != own and record:
                            ring.publish(record)
                except Exception:
                    time.sleep(LOOK)
                finally:
                    if pubsub is not None:
                        try:
                            pubsub.close()
                        except Exception:
                            pass
        finally:
            ring.release_relay(pid)
            with self._lock:
                self._relaying = False
