"""SharedRedis against the real Redis and against a port where nothing listens: fallback, back-off, recovery."""

from __future__ import annotations

import pytest

from qag.redisconn import SharedRedis, from_settings
from qag.settings import SettingsError, load
from tests.services import dead_redis_url, redis_url


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_call_runs_against_real_redis(uniq):
    shared = SharedRedis(redis_url())
    key = uniq("qag:test:")
    try:
        assert shared.call(lambda r: r.incr(key), lambda: -1) == 1
        assert shared.call(lambda r: r.incr(key), lambda: -1) == 2
    finally:
        shared.client().delete(key)
    assert shared.fallbacks == 0


def test_failure_falls_back_backs_off_and_recovers():
    clock = Clock()
    shared = SharedRedis(dead_redis_url(), clock=clock, retry_after=5.0)
    tried = []

    def fn(r):
        tried.append(1)
        return r.ping()

    assert shared.call(fn, lambda: "local") == "local"
    assert len(tried) == 1 and shared.fallbacks == 1 and not shared.available
    clock.now += 4.9          # still backing off: Redis is not even tried
    assert shared.call(fn, lambda: "local") == "local"
    assert len(tried) == 1 and shared.fallbacks == 2
    clock.now += 0.2          # back-off over; point the client at a live Redis, as if it had come back
    shared.url = redis_url()
    shared._client = None
    assert shared.call(fn, lambda: "local") is True
    assert shared.available and shared.fallbacks == 2


def test_failure_is_logged_without_the_url(caplog):
    secret_url = dead_redis_url().replace("redis://", "redis://:hunter2-password@")
    shared = SharedRedis(secret_url)
    with caplog.at_level("WARNING", logger="qag.redis"):
        shared.call(lambda r: r.ping(), lambda: None)
        shared.call(lambda r: r.ping(), lambda: None)
    assert len(caplog.records) == 1, "one warning per minute, not one per call"
    assert "hunter2" not in caplog.text and "retrying" in caplog.text


def test_setting_accepts_redis_schemes_and_refuses_others_without_echoing():
    assert load({"QAG_REDIS_URL": "redis://localhost:6379/0"}).redis_url == "redis://localhost:6379/0"
    assert load({"QUERYAPIGATE_REDIS_URL": "unix:///run/redis.sock"}).redis_url == "unix:///run/redis.sock"
    assert from_settings(load({})) is None
    with pytest.raises(SettingsError) as refused:
        load({"QAG_REDIS_URL": "http://:secretpw@host"})
    assert "secretpw" not in str(refused.value) and "QAG_REDIS_URL" in str(refused.value)


def test_a_url_the_client_cannot_read_is_refused_at_startup_without_its_password():
    with pytest.raises(SettingsError) as refused:
        load({"QAG_REDIS_URL": "redis://:pw/with-slash@cache:63x79/0"})
    assert "pw" not in str(refused.value) and "QAG_REDIS_URL" in str(refused.value)


def test_call_now_tries_redis_even_while_backing_off(uniq):
    clock = Clock()
    shared = SharedRedis(dead_redis_url(), clock=clock)
    shared.call(lambda r: r.ping(), lambda: None)         # fails: backing off now
    assert not shared.available
    shared.url = redis_url()                              # Redis is back before the back-off ends
    shared._client = None
    key = uniq("qag:test:now:")
    try:
        assert shared.call(lambda r: r.set(key, 1), lambda: "skipped") == "skipped"   # call() waits it out
        assert shared.call_now(lambda r: r.set(key, 1), lambda: "skipped") is True     # call_now() does not
    finally:
        shared.client().delete(key)
