"""The SQLite case: qag's demo shop (qag/demo.py) copied into each target's home, two per-customer queries.

Needs no database server, so the harness's smoke test runs it anywhere; QueryAPIGate can serve it too (its
SQLite paths resolve against its home, as qag's do).
"""

from __future__ import annotations

import os
import shutil
import tempfile

from qag import demo

from .workload import Case, KeySpace, Query

_SHOP: list[str] = []


def _shop_file() -> str:
    if not _SHOP:
        path = os.path.join(tempfile.mkdtemp(prefix="qag-bench-shop-"), demo.SHOP_FILE)
        demo.generate_shop(path)
        _SHOP.append(path)
    return _SHOP[0]


def setup_home(home: str) -> None:
    shutil.copyfile(_shop_file(), os.path.join(home, demo.SHOP_FILE))


class SqliteCase(Case):
    def setup_home(self, home: str) -> None:  # noqa: D102 - see module docstring
        setup_home(home)


def case(args=None) -> Case:
    space = KeySpace((("id", demo.CUSTOMERS),))
    cid = {"id": {"type": "int", "required": True, "min": 1, "max": demo.CUSTOMERS}}
    queries = (
        Query("shop_customer", "One customer by id",
              "SELECT id, name, email, city, joined_on FROM customers WHERE id = :id", cid, (("id", "id"),)),
        Query("shop_customer_orders", "A customer with their orders (a join)",
              "SELECT c.id, c.name, o.id AS order_id, o.status, o.total, o.ordered_at\n"
              "FROM customers c LEFT JOIN orders o ON o.customer_id = c.id\n"
              "WHERE c.id = :id ORDER BY o.ordered_at DESC", cid, (("id", "id"),), {"page_size": 50}),
    )
    governed = {"allowed_tables": ["customers", "orders"],
                "mask": [{"column": "customers.email", "action": "mask"}]}
    return SqliteCase("sqlite", "sqlite", space, queries, {"name": "shop", "db": "sqlite", "database": demo.SHOP_FILE},
                      None, governed=governed)
