"""backends/registry: a driver that can't be imported is named with what to install, in one line."""

from __future__ import annotations

import importlib.util

import pytest

from qag.backends import registry
from qag.errors import QagError
from qag.settings import load


@pytest.fixture
def no_mysql_driver(monkeypatch):
    real = importlib.import_module

    def import_module(name, *args):
        if name in ("qag.backends.mysql", "MySQLdb"):
            raise ImportError("No module named 'MySQLdb'")
        return real(name, *args)
    monkeypatch.setattr(registry.importlib, "import_module", import_module)


def test_a_missing_driver_names_the_system_packages_and_the_extra(no_mysql_driver):
    line = registry.missing_driver("mysql")
    assert "default-libmysqlclient-dev" in line and "pip install 'qag[mysql]'" in line and "MySQLdb" in line
    assert "\n" not in line
    assert registry.missing_driver("sqlite") is None
    # PostgreSQL's driver is the postgres extra: reported exactly when it is not installed.
    assert (registry.missing_driver("postgres") is None) == (importlib.util.find_spec("psycopg") is not None)


def test_a_call_on_a_connection_without_its_driver_is_500_driver_missing(no_mysql_driver, tmp_path):
    backends = registry.Backends(load({"QAG_HOME": str(tmp_path)}), ())
    with pytest.raises(QagError) as info:
        backends.get("mysql")
    assert info.value.code == "driver_missing" and info.value.status == 500
    assert "default-libmysqlclient-dev" in info.value.message
