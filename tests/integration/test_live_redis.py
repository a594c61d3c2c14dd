"""Live events across instances (qag/observe/live_redis.py) against a real Redis: a worker's publisher."""

from __future__ import annotations

import secrets
import time

import pytest

from qag.observe import live_redis
from tests.services import redis_url


@pytest.fixture
def names():
    """A deployment prefix of this test's own (the test Redis is shared), so its channel and listeners key too."""
    prefix = f"qag-test:{secrets.token_hex(6)}:"
    import redis
    client = redis.Redis.from_url(redis_url(), socket_timeout=2)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(prefix + live_redis.CHANNEL)
    yield client, pubsub, prefix
    pubsub.close()
    client.delete(prefix + live_redis.LISTENERS)


def _published(pubsub, seconds: float) -> list[bytes]:
    end, seen = time.monotonic() + seconds, []
    while time.monotonic() < end:
        message = pubsub.get_message(timeout=0.1)
        if message is not None and message.get("type") == "message":
            seen.append(message["data"])
    return seen


def test_a_workers_first_runs_reach_another_instances_streams(names):
    """A worker that has not looked at LISTENERS yet (its first run) offers the run: the look that follows at once
    finds another instance's streams and publishes it. Before, the first look came a second later and the runs of
    that second stayed on their own host."""
    client, pubsub, prefix = names
    client.set(prefix + live_redis.LISTENERS, b"1", ex=30)
    relay = live_redis.Relay(redis_url(), prefix)
    assert relay.remote_listeners                  # not looked yet: offered, not dropped
    relay.offer(7, b"first run")
    assert _published(pubsub, 0.8) == [b"7\nfirst run"]   # well within the second the old first look took
    assert relay.remote_listeners


def test_without_listeners_what_was_offered_before_the_first_look_is_dropped(names):
    """No instance holds a stream: the first look says so, drops what was offered before it, and runs are no longer
    offered."""
    _, pubsub, prefix = names
    relay = live_redis.Relay(redis_url(), prefix)
    assert relay.remote_listeners
    relay.offer(7, b"nobody listens")
    deadline = time.monotonic() + 3
    while relay.remote_listeners and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not relay.remote_listeners
    assert _published(pubsub, 0.5) == []
