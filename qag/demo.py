"""The embedded demo: a deterministic SQLite shop, saved queries over it, an admin key and a scoped key."""

from __future__ import annotations

import json
import os
import random
import shutil
import sqlite3

SHOP_FILE = "shop.db"
KEYS_FILE = "demo-keys.json"
CUSTOMERS = 5_000
ITEMS = 1_000
ORDERS = 20_000
LINES_PER_ORDER = (1, 5)   # ~60,000 order lines: the largest table
WAREHOUSES = 3
CITIES = ("Lisbon", "Porto", "Madrid", "Lyon", "Berlin", "Krakow", "Oslo", "Dublin", "Milan", "Ghent")
STATUSES = ("new", "paid", "shipped", "delivered", "cancelled")
FIRST = ("Ana", "Bo", "Chen", "Dara", "Eli", "Femi", "Gus", "Hana", "Ivo", "Jo", "Kai", "Lena", "Mo", "Nia")
LAST = ("Silva", "Berg", "Novak", "Ortiz", "Keane", "Rossi", "Dubois", "Weber", "Haddad", "Sato")
WORDS = ("steel", "oak", "blue", "compact", "travel", "classic", "solar", "pocket", "garden", "studio")
THINGS = ("lamp", "kettle", "chair", "backpack", "speaker", "mug", "notebook", "jacket", "clock", "tent")

SAVED_QUERIES = (
    {"name": "customer", "description": "One customer by id",
     "sql": "SELECT id, name, email, city, joined_on FROM customers WHERE id = :id",
     "parameters": {"id": {"type": "int", "required": True, "min": 1, "description": "customer id"}}},
    {"name": "orders_by_status", "description": "Orders in a status, newest first, paged",
     "sql": "SELECT id, customer_id, status, total, ordered_at FROM orders WHERE status = :status "
            "ORDER BY ordered_at DESC, id DESC",
     "parameters": {"status": {"type": "str", "enum": list(STATUSES), "default": "paid"}}},
    {"name": "customer_orders", "description": "A customer's orders with their line counts (a join)",
     "sql": "SELECT o.id AS order_id, o.status, o.total, o.ordered_at, count(l.item_id) AS lines\n"
            "FROM orders o JOIN order_lines l ON l.order_id = o.id\n"
            "WHERE o.customer_id = :customer_id\nGROUP BY o.id ORDER BY o.ordered_at DESC",
     "parameters": {"customer_id": {"type": "int", "required": True, "min": 1}}},
    {"name": "sales_by_city", "description": "Revenue per city since a date (an aggregate)",
     "sql": "SELECT c.city, count(*) AS orders, round(sum(o.total), 2) AS revenue\n"
            "FROM orders o JOIN customers c ON c.id = o.customer_id\n"
            "WHERE o.ordered_at >= :since AND o.status <> 'cancelled'\nGROUP BY c.city ORDER BY revenue DESC",
     "parameters": {"since": {"type": "str", "default": "2025-01-01", "pattern": r"\d{4}-\d{2}-\d{2}"}}},
    {"name": "low_stock", "description": "Items whose stock in a warehouse is below a threshold",
     "sql": "SELECT s.warehouse, i.id AS item_id, i.name, s.quantity FROM stock s JOIN items i ON i.id = s.item_id\n"
            "WHERE s.quantity < :below ORDER BY s.quantity, i.id",
     "parameters": {"below": {"type": "int", "default": 10, "min": 0, "max": 1000}}},
)
SCOPED_KEY = {"name": "demo-partner", "connections": [], "queries": ["customer", "sales_by_city"]}


def generate_shop(path: str, seed: int = 7) -> None:
    """Write the shop database; the same seed always gives the same rows."""
    rng = random.Random(seed)
    tmp = path + ".tmp"
    if os.path.exists(tmp):
        os.remove(tmp)
    conn = sqlite3.connect(tmp)
    conn.executescript("""
        CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, email TEXT NOT NULL, city TEXT NOT NULL,
                                joined_on TEXT NOT NULL);
        CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL, price REAL NOT NULL);
        CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers (id),
                             status TEXT NOT NULL, total REAL NOT NULL, ordered_at TEXT NOT NULL);
        CREATE TABLE order_lines (order_id INTEGER NOT NULL REFERENCES orders (id),
                                  item_id INTEGER NOT NULL REFERENCES items (id), quantity INTEGER NOT NULL,
                                  price REAL NOT NULL, PRIMARY KEY (order_id, item_id));
        CREATE TABLE stock (warehouse INTEGER NOT NULL, item_id INTEGER NOT NULL REFERENCES items (id),
                            quantity INTEGER NOT NULL, PRIMARY KEY (warehouse, item_id));
    """)
    customers = []
    for cid in range(1, CUSTOMERS + 1):
        first, last = rng.choice(FIRST), rng.choice(LAST)
        customers.append((cid, f"{first} {last}", f"{first.lower()}.{last.lower()}{cid}@example.com",
                          rng.choice(CITIES), f"20{rng.randint(19, 25)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"))
    items = [(iid, f"{rng.choice(WORDS)} {rng.choice(THINGS)} {iid}", round(rng.uniform(2, 300), 2))
             for iid in range(1, ITEMS + 1)]
    prices = {iid: price for iid, _, price in items}
    orders, lines = [], []
    for oid in range(1, ORDERS + 1):
        chosen = rng.sample(range(1, ITEMS + 1), rng.randint(*LINES_PER_ORDER))
        total = 0.0
        for iid in chosen:
            qty = rng.randint(1, 4)
            lines.append((oid, iid, qty, prices[iid]))
            total += qty * prices[iid]
        day = f"20{rng.randint(24, 26)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        orders.append((oid, rng.randint(1, CUSTOMERS), rng.choice(STATUSES), round(total, 2),
                       f"{day} {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}"))
    stock = [(w, iid, rng.randint(0, 500)) for w in range(1, WAREHOUSES + 1) for iid in range(1, ITEMS + 1)]
    with conn:
        conn.executemany("INSERT INTO customers VALUES (?, ?, ?, ?, ?)", customers)
        conn.executemany("INSERT INTO items VALUES (?, ?, ?)", items)
        conn.executemany("INSERT INTO orders VALUES (?, ?, ?, ?, ?)", orders)
        conn.executemany("INSERT INTO order_lines VALUES (?, ?, ?, ?)", lines)
        conn.executemany("INSERT INTO stock VALUES (?, ?, ?)", stock)
        conn.execute("CREATE INDEX orders_customer ON orders (customer_id)")
        conn.execute("CREATE INDEX orders_status ON orders (status, ordered_at)")
    conn.close()
    os.replace(tmp, path)


def prepare_home(home: str, reset: bool, call) -> dict:
    """Create (or reuse) the demo home; returns {"admin_key", "scoped_key"}.

    `call(method, path, body)` runs a management request in-process as the CLI administrator, so the demo
    is built through the same validation as the API.
    """
    keys_path = os.path.join(home, KEYS_FILE)
    if reset and os.path.isdir(home):
        shutil.rmtree(home)
    os.makedirs(home, exist_ok=True)
    if os.path.exists(keys_path):
        with open(keys_path, encoding="utf-8") as fh:
            return json.load(fh)
    shop = os.path.join(home, SHOP_FILE)
    if not os.path.exists(shop):
        generate_shop(shop)
    call("POST", "/api/v1/connections", {"name": "shop", "db": "sqlite", "database": SHOP_FILE})
    for q in SAVED_QUERIES:
        call("POST", "/api/v1/queries", dict(q, connection_name="shop", publish=True, author="demo"))
    scoped = call("POST", "/api/v1/api-keys", SCOPED_KEY)
    keys = {"admin_key": "adm_" + os.urandom(24).hex(), "scoped_key": scoped["secret"]}
    # The demo keeps its own secrets so `qag demo` can print working curl lines on every start.
    fd = os.open(keys_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(keys, fh)
    return keys


def banner(base_url: str, keys: dict, home: str) -> str:
    admin, scoped = keys["admin_key"], keys["scoped_key"]
    return f"""
qag demo — serving {base_url} (home: {home})

  admin key:  {admin}
  scoped key: {scoped}   (runs only 'customer' and 'sales_by_city')

Try:
  curl -s -H 'X-API-Key: {scoped}' '{base_url}/q/customer?id=42'
  curl -s -H 'X-API-Key: {scoped}' '{base_url}/q/sales_by_city?since=2026-01-01&format=csv'
  curl -s -H 'X-API-Key: {admin}' '{base_url}/q/orders_by_status?status=shipped&page=2&page_size=5' -D -

Management API: {base_url}/api/v1/queries (admin key), docs: {base_url}/docs
"""
