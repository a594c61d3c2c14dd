"""Settings parsing and validation, and the generated docs staying in step with the code."""

from __future__ import annotations

import os

import pytest

from qag import errors, settings
from qag.settings import SettingsError, load

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_defaults():
    s = load({"QAG_HOME": "/tmp"})
    assert (s.threads, s.workers, s.query_timeout, s.max_page_size, s.allow_writes, s.speedups) == \
        (8, 2, 30.0, 1000, False, "auto")


@pytest.mark.parametrize("name,value", [("QAG_THREADS", "0"), ("QAG_THREADS", "257"), ("QAG_THREADS", "eight"),
                                        ("QUERYAPIGATE_THREADS", "-1"), ("QAG_ACCESS_LOG", "maybe"),
                                        ("QAG_SPEEDUPS", "fast"), ("QAG_QUERY_TIMEOUT", "-1"),
                                        ("QAG_QUERY_TIMEOUT", "nan"), ("QAG_MAX_PAGE_SIZE", "0"),
                                        ("QAG_BIND", "nowhere"), ("QAG_HSTS_MAX_AGE", "0"),
                                        ("QAG_API_KEY", ""), ("QAG_SPIN_US", "-1"), ("QAG_SPIN_US", "10001"),
                                        ("QAG_SPIN_US", "0.5")])
def test_invalid_values_name_the_variable(name, value):
    with pytest.raises(SettingsError) as raised:
        load({name: value})
    message = str(raised.value)
    assert name in message and "\n" not in message


def test_alias_and_flags():
    s = load({"QUERYAPIGATE_THREADS": "2", "QUERYAPIGATE_ACCESS_LOG": "off", "QAG_ALLOW_WRITES": "YES"})
    assert s.threads == 2 and s.access_log is False and s.allow_writes is True
    with pytest.raises(SettingsError, match="more than once"):
        load({"QAG_THREADS": "2", "QUERYAPIGATE_THREADS": "3"})


def test_secret_file_forms(tmp_path):
    f = tmp_path / "k"
    f.write_text("abc\r\n")
    assert load({"QUERYAPIGATE_API_KEY_FILE": str(f)}).api_key == "abc"
    with pytest.raises(SettingsError, match="cannot read"):
        load({"QAG_API_KEY_FILE": str(tmp_path / "missing")})


def test_leftover_sql2api_names_the_replacement_not_the_value():
    with pytest.raises(SettingsError) as raised:
        load({"SQL2API_API_KEY": "hunter2"})
    assert "SQL2API_API_KEY -> QUERYAPIGATE_API_KEY" in str(raised.value) and "hunter2" not in str(raised.value)


def test_cors_origins_normalised():
    assert load({"QAG_CORS_ORIGINS": "https://A.example/, ,https://b.example"}).cors_origins == \
        ("https://a.example", "https://b.example")


def test_every_setting_documented_once():
    names = [s.name for s in settings.SETTINGS]
    assert len(names) == len(set(names)) and all(n.startswith("QAG_") for n in names)
    assert all(s.doc and s.accepted for s in settings.SETTINGS)


@pytest.mark.parametrize("path,generate", [("docs/configuration.md", settings.generate_markdown),
                                           ("docs/errors.md", errors.generate_markdown)])
def test_generated_docs_are_current(path, generate):
    with open(os.path.join(ROOT, path), encoding="utf-8") as fh:
        assert fh.read() == generate(), f"{path} is out of date: run `python -m qag.{path[5:-3].replace('configuration', 'settings')} > {path}`"


def test_error_table_statuses():
    for code, (status, message, when) in errors.ERRORS.items():
        assert 400 <= status < 600 and message and when
        err = errors.QagError(code)
        assert err.status == status and err.envelope("r")["code"] == code


def test_settings_read_as_attributes_and_unknown_names_refused():
    s = load({"QAG_QUERY_TIMEOUT": "12"})
    assert s.query_timeout == 12.0 and s.values["query_timeout"] == 12.0
    changed = s.with_overrides(query_timeout=3.0)
    assert changed.query_timeout == 3.0 and s.query_timeout == 12.0   # the original is untouched
    with pytest.raises(AttributeError):
        s.not_a_setting
    with pytest.raises(Exception):   # frozen: settings are read, never assigned
        s.query_timeout = 1.0


@pytest.mark.parametrize("name,expected", [
    ("QAG_WORKER", "QAG_WORKER is not a qag setting; did you mean QAG_WORKERS?"),
    ("QAG_DATABSE_URL", "QAG_DATABSE_URL is not a qag setting; did you mean QAG_DATABASE_URL?"),
    ("QAG_API_KEYS_FILE", "QAG_API_KEYS_FILE is not a qag setting; did you mean QAG_API_KEY_FILE?"),
    ("QAG_PORT", "QAG_PORT is not a qag setting; did you mean QAG_BIND?"),
    ("QAG_FOO", "QAG_FOO is not a qag setting; see docs/configuration.md"),
    ("QAG_HOME_FILE", "QAG_HOME_FILE is not a qag setting; only secrets have a _FILE form: set QAG_HOME itself"),
])
def test_unknown_qag_names_are_refused_naming_the_closest_setting(name, expected):
    with pytest.raises(SettingsError) as raised:
        load({"QAG_HOME": "/tmp", name: "4"})
    assert str(raised.value) == expected and "\n" not in expected


def test_names_qag_reads_elsewhere_are_accepted(tmp_path):
    f = tmp_path / "key"
    f.write_text("sk_admin_from_a_file\n")
    s = load({"QAG_HOME": "/tmp", "QAG_TEST_STORE": "postgresql", "QAG_TEST_PG_HOST": "h", "QAG_BENCH_PG_USER": "u",
              "QAG_BENCH_WRK_MODE": "open", "QAG_BUILD_SPEEDUPS": "require", "QAG_API_KEY_FILE": str(f),
              "QUERYAPIGATE_HOST": "127.0.0.1", "QUERYAPIGATE_PORT": "5001", "QAG_DEMO_HOME": "/tmp/demo"})
    assert (s.bind, s.demo_home, s.api_key) == ("127.0.0.1:5001", "/tmp/demo", "sk_admin_from_a_file")
    assert load({}).demo_home == load({"QAG_DEMO_HOME": ""}).demo_home == "demo-home"
    assert all(p.startswith("QAG_") and p.endswith("_") for p in settings.ALLOWED_PREFIXES)
    assert all(f"`{p}`" in settings.generate_markdown() for p in settings.ALLOWED_PREFIXES)


def test_unknown_queryapigate_names_are_ignored_and_listed():
    env = {"QUERYAPIGATE_DEBUG": "1", "QUERYAPIGATE_WORKERS": "4", "QUERYAPIGATE_THREADS": "3",
           "QUERYAPIGATE_API_KEY_FILE": "/nonexistent", "QUERYAPIGATE_PORT": "5001"}
    assert settings.unused_aliases(env) == ["QUERYAPIGATE_DEBUG", "QUERYAPIGATE_WORKERS"]
    del env["QUERYAPIGATE_API_KEY_FILE"]
    assert load(env).threads == 3   # QueryAPIGate names qag lacks stop nothing


# --- values that passed startup and broke later, or were refused in a line naming no setting ------------------
@pytest.mark.parametrize("name,value", [
    ("QAG_QUERY_TIMEOUT", "3000000"), ("QAG_QUERY_TIMEOUT", "1e308"), ("QAG_QUERY_TIMEOUT", "inf"),
    ("QAG_QUERY_TIMEOUT", "2147483"), ("QAG_METADATA_CACHE_TTL", "1e308"), ("QAG_METADATA_CACHE_TTL", "86401"),
    ("QAG_POOL_WAIT", "1e308"), ("QAG_POOL_IDLE_TIMEOUT", "1e308"), ("QAG_SLOW_QUERY_THRESHOLD", "1e308"),
    ("QUERYAPIGATE_QUERY_TIMEOUT", "1e400"),
])
def test_seconds_that_become_milliseconds_or_nanoseconds_are_bounded(name, value):
    # PostgreSQL's statement_timeout takes at most 2147483647 ms; the metadata cache keeps int64 nanoseconds.
    with pytest.raises(SettingsError) as raised:
        load({name: value})
    assert str(raised.value).startswith(f"{name} must be ") and value in str(raised.value)
    assert "\n" not in str(raised.value)


def test_the_largest_accepted_seconds_still_work():
    s = load({"QAG_QUERY_TIMEOUT": "2147482", "QAG_METADATA_CACHE_TTL": "86400", "QAG_POOL_WAIT": "3600"})
    assert (s.query_timeout, s.metadata_cache_ttl, s.pool_wait) == (2147482.0, 86400.0, 3600.0)
    assert load({"QAG_QUERY_TIMEOUT": "1e3"}).query_timeout == 1000.0


@pytest.mark.parametrize("name,value", [
    ("QAG_BIND", "127.0.0.1:²"), ("QAG_BIND", "127.0.0.1:٥٠٠٠"), ("QAG_THREADS", "٤"), ("QAG_THREADS", "1_0"),
    ("QAG_QUERY_TIMEOUT", "1_0"), ("QAG_QUERY_TIMEOUT", "infinity"), ("QAG_HISTORY_SAMPLE_RATE", "nan"),
    ("QAG_ADMIN_BIND", ":²"), ("QUERYAPIGATE_PORT", "٥٠٠٠"),
])
def test_numbers_are_ascii_digits_and_refused_naming_the_setting(name, value):
    with pytest.raises(SettingsError) as raised:
        load({name: value})
    assert name in str(raised.value) and "invalid literal" not in str(raised.value)


def test_ipv6_binds_are_written_in_brackets():
    with pytest.raises(SettingsError) as raised:
        load({"QAG_BIND": "::1:7501"})   # gunicorn read it as host "" and port ":1:7501"
    assert str(raised.value) == ("QAG_BIND must be host:port with an IPv6 address in brackets ([::1]:7501), "
                                 "not '::1:7501'")
    assert load({"QAG_BIND": "[::1]:7501"}).bind == "[::1]:7501"
    assert load({"QAG_ADMIN_BIND": "[::]:7502"}).admin_bind == "[::]:7502"
    for bad in ("[::1:7501", "[nothost]:7501", "a]:7501"):
        with pytest.raises(SettingsError, match="QAG_BIND must be host:port"):
            load({"QAG_BIND": bad})
    # QueryAPIGate's host alone is only a host: put in brackets for gunicorn.
    assert load({"QUERYAPIGATE_HOST": "::1"}).bind == "[::1]:5000"
    assert load({"QUERYAPIGATE_HOST": "::", "QUERYAPIGATE_PORT": "7503"}).bind == "[::]:7503"


@pytest.mark.parametrize("value", ["unix:", "unix:  ", "unix://"])
def test_a_unix_bind_needs_a_path(value):
    with pytest.raises(SettingsError, match="QAG_BIND must name the socket's path"):
        load({"QAG_BIND": value})


def test_a_secret_file_that_is_not_text_is_refused_without_its_bytes(tmp_path):
    f = tmp_path / "key.bin"
    f.write_bytes(b"sk_abc\xff\xfe\x80secretbytes")
    with pytest.raises(SettingsError) as raised:
        load({"QAG_API_KEY_FILE": str(f)})
    message = str(raised.value)
    assert message == f"QAG_API_KEY_FILE: {str(f)!r} is not UTF-8 text; it must hold the value alone"
    assert "secretbytes" not in message and "0xff" not in message and "codec" not in message


def test_text_values_are_trimmed_and_empty_is_unset():
    s = load({"QAG_HOME": " /srv/x\n", "QAG_EVENTS_HOST": "", "QAG_THREADS": " ", "QAG_LOG_LEVEL": " debug\n",
              "QAG_BIND": " :7504 "})
    assert (s.home, s.events_host, s.threads, s.log_level, s.bind) == \
        ("/srv/x", "127.0.0.1", 8, "debug", "127.0.0.1:7504")
    assert load({"QAG_EVENTS_HOST": "  \t"}).events_host == "127.0.0.1"
    assert load({"QAG_BIND": "", "QUERYAPIGATE_PORT": "7505"}).bind == "127.0.0.1:7505"
    # qag config names the default as the source of a set-but-empty variable, as load() reads it.
    source = dict((s.name, src) for s, src in settings.sources({"QAG_EVENTS_HOST": "", "QAG_THREADS": "3"}))
    assert source["QAG_EVENTS_HOST"] is None and source["QAG_THREADS"] == "QAG_THREADS"


@pytest.mark.parametrize("name", ["QAG_API_KEY", "QAG_MCP_API_KEY", "QAG_MASK_KEY", "QAG_METRICS_TOKEN",
                                  "QAG_JWT_SECRET"])
@pytest.mark.parametrize("value", [" sk_admin_key_0123456789abcdefghijkl", "sk_admin_key_0123456789abcdefghijkl ",
                                   "sk_admin_key_0123456789abcdefghijkl\n", "\tsk_admin_key_0123456789abcdefghijkl"])
def test_keys_with_surrounding_whitespace_are_refused_never_shown(name, value):
    # HTTP trims a header's value: an admin key with a space at either end could never be matched.
    with pytest.raises(SettingsError) as raised:
        load({name: value})
    message = str(raised.value)
    assert message.startswith(f"{name} starts or ends with whitespace") and "sk_admin" not in message


def test_blank_keys_and_keys_from_a_file_with_two_newlines_are_refused(tmp_path):
    with pytest.raises(SettingsError, match="^QAG_API_KEY is set but empty$"):
        load({"QAG_API_KEY": " "})
    f = tmp_path / "key"
    f.write_text("sk_from_a_file_42\n\n")
    with pytest.raises(SettingsError) as raised:
        load({"QAG_API_KEY_FILE": str(f)})
    assert str(raised.value).startswith("QAG_API_KEY_FILE starts or ends with whitespace")
    assert "sk_from_a_file_42" not in str(raised.value)
    f.write_text("sk_from_a_file_42\n")   # one newline: the file's end, removed
    assert load({"QAG_API_KEY_FILE": str(f)}).api_key == "sk_from_a_file_42"
    with pytest.raises(SettingsError, match="^QAG_API_KEY holds a control character"):
        load({"QAG_API_KEY": "sk_a\x00b"})


@pytest.mark.parametrize("url", ["redis://h:6379/abc", "redis://:pw-never-shown@h:6379/abc", "redis://h:6379/-1",
                                 "redis://h:6379/1/2", "redis://h:6379/99999999999", "rediss://h/%31x",
                                 "redis://h:6379/0?db=abc"])
def test_a_redis_database_that_is_no_number_is_refused(url):
    # redis-py's parse_url ignores such a path (database 0, quietly) and reads /1/2 as database 12.
    pytest.importorskip("redis", reason="the redis extra: without it any QAG_REDIS_URL is refused for that")
    with pytest.raises(SettingsError, match="database") as raised:
        load({"QAG_REDIS_URL": url})
    assert str(raised.value).startswith("QAG_REDIS_URL") and "pw-never-shown" not in str(raised.value)
    assert "\n" not in str(raised.value)


def test_redis_databases_that_are_numbers_pass():
    pytest.importorskip("redis", reason="the redis extra: without it any QAG_REDIS_URL is refused for that")
    for url in ("redis://h:6379", "redis://h:6379/", "redis://h:6379/0", "redis://:p@h:6379/15", "unix:///tmp/r.sock",
                "unix:///tmp/r.sock?db=3", "redis://h?db=2"):
        assert load({"QAG_REDIS_URL": url}).redis_url == url


@pytest.mark.parametrize("env, expected", [({}, None), ({"QAG_THREADS": "1"}, 1), ({"QAG_THREADS": "9"}, 4),
                                           ({"QAG_MAX_STREAMS": "0"}, 0), ({"QAG_MAX_STREAMS": "7"}, 7)])
def test_streams_per_worker_leave_half_the_threads_to_calls(env, expected):
    loaded = load(env)
    assert loaded.max_streams == (max(1, loaded.threads // 2) if expected is None else expected)


@pytest.mark.parametrize("value", ["-1", "10001", "two"])
def test_max_streams_out_of_range_is_refused(value):
    with pytest.raises(SettingsError, match="QAG_MAX_STREAMS"):
        load({"QAG_MAX_STREAMS": value})
