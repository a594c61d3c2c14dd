"""The unit tier needs nothing but qag's base dependencies, pytest and hypothesis: no server, no optional driver."""

from __future__ import annotations

import os
import time

import pytest


@pytest.fixture
def store_env():
    """The store the unit tier's store tests run on: SQLite in QAG_HOME ({}). The same tests run on a PostgreSQL
    store (a server) in tests/integration: test_store_postgres.py and test_history_postgres.py."""
    return {}


@pytest.fixture
def tz():
    """Run a test in a given server time zone, then put the process's zone back."""
    before = os.environ.get("TZ")

    def use(name: str) -> None:
        os.environ["TZ"] = name
        time.tzset()

    yield use
    if before is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = before
    time.tzset()
