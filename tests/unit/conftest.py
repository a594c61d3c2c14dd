"""The unit tier needs nothing but qag's base dependencies, pytest and hypothesis: no server, no optional driver."""

from __future__ import annotations

import pytest


@pytest.fixture
def store_env():
    """The store the unit tier's store tests run on: SQLite in QAG_HOME ({}). The same tests run on a PostgreSQL
    store (a server) in tests/integration: test_store_postgres.py and test_history_postgres.py."""
    return {}
