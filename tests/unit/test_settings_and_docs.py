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
