"""The run-history and tracing tests of tests/unit (test_observe_history.py, test_tracing.py) on a PostgreSQL store
(a real server): the unit tier runs them on SQLite."""

from __future__ import annotations

import inspect

import pytest

from tests.unit import test_observe_history, test_tracing
from tests.unit.test_observe_history import app  # noqa: F401  (a fixture of those tests)
from tests.unit.test_tracing import receiver  # noqa: F401  (a fixture of those tests)

# Every test of those files that takes the store (store_env, or the app built on it), collected here again.
for _module in (test_observe_history, test_tracing):
    globals().update({name: test for name, test in vars(_module).items() if name.startswith("test_")
                      and {"app", "store_env"} & set(inspect.signature(test).parameters)})


@pytest.fixture
def store_env(pg_store_url):
    """A fresh PostgreSQL store (a schema of the session's store database) for each test."""
    return {"QAG_DATABASE_URL": pg_store_url}
