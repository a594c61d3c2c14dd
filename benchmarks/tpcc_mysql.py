"""The six-database MySQL case: deterministic TPC-C-shaped data, its loader, six per-customer saved queries and a
stream of one of them.

    python -m benchmarks.tpcc_mysql --warehouses 2            # generate and load (skipped when already loaded)
    python -m benchmarks.tpcc_mysql --warehouses 2 --reload   # drop and reload
    python -m benchmarks.tpcc_mysql --load-method insert      # multi-row INSERTs instead of LOAD DATA LOCAL

TPC-C's tables at W warehouses (10 districts each, 3,000 customers per district, 100,000 items, a stock row per
item and warehouse, 3,000 orders per district with 5-15 lines each, the newest 900 of them still new), split
into six databases on one server, one per microservice: org (warehouse, district), crm (customer), orders
(orders, new_order, order_line), catalog (item), inventory (stock), billing (history, indexed by customer).
No external loader: the rows come from Python's `random.Random(seed)`, so the same seed gives the same bytes,
written as tab-separated files and loaded with LOAD DATA LOCAL INFILE (or batched multi-row INSERTs).
A read-only user gets SELECT on the six databases and nothing else.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time

from .workload import Case, KeySpace, Query

GENERATOR_VERSION = "1"
DISTRICTS = 10
CUSTOMERS = 3000          # per district
ITEMS = 100_000
ORDERS = 3000             # per district (each customer has one, as in TPC-C's initial population)
NEW_ORDERS = 900          # the newest orders of each district have no carrier yet
DATABASES = ("org", "crm", "orders", "catalog", "inventory", "billing")
RO_USER = "qag_bench_ro"
RO_PASSWORD = os.environ.get("QAG_BENCH_RO_PASSWORD", "qag-bench-ro")

SCHEMA = {
    "org": [
        """CREATE TABLE warehouse (w_id SMALLINT NOT NULL PRIMARY KEY, w_name VARCHAR(10), w_street_1 VARCHAR(20),
           w_city VARCHAR(20), w_state CHAR(2), w_zip CHAR(9), w_tax DECIMAL(4,4), w_ytd DECIMAL(12,2))""",
        """CREATE TABLE district (d_w_id SMALLINT NOT NULL, d_id TINYINT NOT NULL, d_name VARCHAR(10),
           d_street_1 VARCHAR(20), d_city VARCHAR(20), d_state CHAR(2), d_zip CHAR(9), d_tax DECIMAL(4,4),
           d_ytd DECIMAL(12,2), d_next_o_id INT, PRIMARY KEY (d_w_id, d_id))""",
        "CREATE TABLE bench_meta (k VARCHAR(32) PRIMARY KEY, v VARCHAR(200))",
    ],
    "crm": [
        """CREATE TABLE customer (c_w_id SMALLINT NOT NULL, c_d_id TINYINT NOT NULL, c_id INT NOT NULL,
           c_first VARCHAR(16), c_middle CHAR(2), c_last VARCHAR(16), c_street_1 VARCHAR(20), c_city VARCHAR(20),
           c_state CHAR(2), c_zip CHAR(9), c_phone CHAR(16), c_since DATETIME, c_credit CHAR(2),
           c_credit_lim DECIMAL(12,2), c_discount DECIMAL(4,4), c_balance DECIMAL(12,2),
           c_ytd_payment DECIMAL(12,2), c_payment_cnt SMALLINT, c_delivery_cnt SMALLINT, c_data VARCHAR(500),
           PRIMARY KEY (c_w_id, c_d_id, c_id))""",
    ],
    "orders": [
        """CREATE TABLE orders (o_w_id SMALLINT NOT NULL, o_d_id TINYINT NOT NULL, o_id INT NOT NULL,
           o_c_id INT NOT NULL, o_entry_d DATETIME, o_carrier_id TINYINT, o_ol_cnt TINYINT, o_all_local TINYINT,
           PRIMARY KEY (o_w_id, o_d_id, o_id))""",
        """CREATE TABLE new_order (no_w_id SMALLINT NOT NULL, no_d_id TINYINT NOT NULL, no_o_id INT NOT NULL,
           PRIMARY KEY (no_w_id, no_d_id, no_o_id))""",
        """CREATE TABLE order_line (ol_w_id SMALLINT NOT NULL, ol_d_id TINYINT NOT NULL, ol_o_id INT NOT NULL,
           ol_number TINYINT NOT NULL, ol_i_id INT, ol_supply_w_id SMALLINT, ol_delivery_d DATETIME,
           ol_quantity TINYINT, ol_amount DECIMAL(6,2), ol_dist_info CHAR(24),
           PRIMARY KEY (ol_w_id, ol_d_id, ol_o_id, ol_number))""",
    ],
    "catalog": [
        """CREATE TABLE item (i_id INT NOT NULL PRIMARY KEY, i_im_id INT, i_name VARCHAR(24), i_price DECIMAL(5,2),
           i_data VARCHAR(50))""",
    ],
    "inventory": [
        """CREATE TABLE stock (s_w_id SMALLINT NOT NULL, s_i_id INT NOT NULL, s_quantity SMALLINT,
           s_dist_01 CHAR(24), s_dist_02 CHAR(24), s_dist_03 CHAR(24), s_dist_04 CHAR(24), s_dist_05 CHAR(24),
           s_dist_06 CHAR(24), s_dist_07 CHAR(24), s_dist_08 CHAR(24), s_dist_09 CHAR(24), s_dist_10 CHAR(24),
           s_ytd INT, s_order_cnt SMALLINT, s_remote_cnt SMALLINT, s_data VARCHAR(50),
           PRIMARY KEY (s_w_id, s_i_id))""",
    ],
    "billing": [
        """CREATE TABLE history (h_id INT NOT NULL PRIMARY KEY, h_c_id INT, h_c_d_id TINYINT, h_c_w_id SMALLINT,
           h_d_id TINYINT, h_w_id SMALLINT, h_date DATETIME, h_amount DECIMAL(6,2), h_data VARCHAR(24))""",
    ],
}
# Built after the load (faster than maintaining them row by row).
INDEXES = [
    "CREATE INDEX orders_customer ON `{p}orders`.orders (o_w_id, o_d_id, o_c_id, o_id)",
    "CREATE INDEX history_customer ON `{p}billing`.history (h_c_w_id, h_c_d_id, h_c_id, h_date)",
    "CREATE INDEX customer_last ON `{p}crm`.customer (c_w_id, c_d_id, c_last, c_first)",
]
TABLES = [("org", "warehouse"), ("org", "district"), ("crm", "customer"), ("orders", "orders"),
          ("orders", "new_order"), ("orders", "order_line"), ("catalog", "item"), ("inventory", "stock"),
          ("billing", "history")]

SYLLABLES = ("BAR", "OUGHT", "ABLE", "PRI", "PRES", "ESE", "ANTI", "CALLY", "ATION", "EING")
_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


class _Text:
    """Cheap deterministic random text: slices of one long random string."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.pool = "".join(rng.choice(_LETTERS) for _ in range(8192))

    def __call__(self, lo: int, hi: int) -> str:
        n = self.rng.randint(lo, hi)
        start = self.rng.randrange(0, len(self.pool) - n)
        return self.pool[start:start + n]


def _last_name(n: int) -> str:
    return SYLLABLES[n // 100] + SYLLABLES[(n // 10) % 10] + SYLLABLES[n % 10]


def _date(rng: random.Random, year: int = 2026) -> str:
    return f"{year}-{rng.randint(1, 11):02d}-{rng.randint(1, 28):02d} {rng.randint(0, 23):02d}:" \
           f"{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}"


def generate(warehouses: int, seed: int, payments: int):
    """Yield (database, table, rows iterator) for every table; rows are tuples of str/int/float/None."""
    rng = random.Random(seed)
    text = _Text(rng)

    def items():
        r = random.Random(seed + 1)
        for i in range(1, ITEMS + 1):
            data = text(26, 50)
            if r.random() < 0.1:
                data = data[:10] + "ORIGINAL" + data[18:]
            yield (i, r.randint(1, 10000), text(14, 24), round(r.uniform(1, 100), 2), data)

    def warehouse():
        for w in range(1, warehouses + 1):
            yield (w, text(6, 10), text(10, 20), text(10, 20), text(2, 2).upper(), f"{rng.randint(0, 9999):04d}11111",
                   round(rng.uniform(0, 0.2), 4), 300000.00)

    def district():
        for w in range(1, warehouses + 1):
            for d in range(1, DISTRICTS + 1):
                yield (w, d, text(6, 10), text(10, 20), text(10, 20), text(2, 2).upper(),
                       f"{rng.randint(0, 9999):04d}11111", round(rng.uniform(0, 0.2), 4), 30000.00, ORDERS + 1)

    def customer():
        r = random.Random(seed + 2)
        for w in range(1, warehouses + 1):
            for d in range(1, DISTRICTS + 1):
                for c in range(1, CUSTOMERS + 1):
                    last = _last_name(c - 1 if c <= 1000 else r.randint(0, 999))
                    yield (w, d, c, text(8, 16), "OE", last, text(10, 20), text(10, 20), text(2, 2).upper(),
                           f"{r.randint(0, 9999):04d}11111", f"{r.randint(0, 10**16 - 1):016d}", _date(r, 2025),
                           "BC" if r.random() < 0.1 else "GC", 50000.00, round(r.uniform(0, 0.5), 4), -10.00,
                           10.00, 1, 0, text(300, 500))

    # One order per customer per district (a permutation, as TPC-C's initial population), lines 5-15.
    order_rows: list[tuple] = []
    line_rows: list[tuple] = []
    new_rows: list[tuple] = []
    r = random.Random(seed + 3)
    for w in range(1, warehouses + 1):
        for d in range(1, DISTRICTS + 1):
            cids = list(range(1, CUSTOMERS + 1))
            r.shuffle(cids)
            for o in range(1, ORDERS + 1):
                n_lines = r.randint(5, 15)
                new = o > ORDERS - NEW_ORDERS
                entry = _date(r)
                order_rows.append((w, d, o, cids[o - 1], entry, None if new else r.randint(1, 10), n_lines, 1))
                if new:
                    new_rows.append((w, d, o))
                for n in range(1, n_lines + 1):
                    line_rows.append((w, d, o, n, r.randint(1, ITEMS), w, None if new else entry, 5,
                                      0.0 if not new else round(r.uniform(0.01, 9999.99), 2), text(24, 24)))

    def stock():
        r = random.Random(seed + 4)
        for w in range(1, warehouses + 1):
            for i in range(1, ITEMS + 1):
                yield (w, i, r.randint(10, 100), *(text(24, 24) for _ in range(10)), 0, 0, 0, text(26, 50))

    def history():
        r = random.Random(seed + 5)
        h = 0
        for w in range(1, warehouses + 1):
            for d in range(1, DISTRICTS + 1):
                for c in range(1, CUSTOMERS + 1):
                    for _ in range(payments):
                        h += 1
                        yield (h, c, d, w, d, w, _date(r), round(r.uniform(1, 5000), 2), text(12, 24))

    yield "org", "warehouse", warehouse()
    yield "org", "district", district()
    yield "catalog", "item", items()
    yield "crm", "customer", customer()
    yield "orders", "orders", iter(order_rows)
    yield "orders", "new_order", iter(new_rows)
    yield "orders", "order_line", iter(line_rows)
    yield "inventory", "stock", stock()
    yield "billing", "history", history()


def _tsv_value(v) -> str:
    if v is None:
        return "\\N"
    return str(v)


def _connect(args, database: str | None = None, local_infile: bool = False):
    import MySQLdb
    kw = dict(host=args.host, port=args.port, user=args.user, passwd=args.password, charset="utf8mb4",
              local_infile=1 if local_infile else 0)
    if database:
        kw["db"] = database
    conn = MySQLdb.connect(**kw)
    conn.autocommit(True)
    return conn


def db_name(prefix: str, name: str) -> str:
    return f"{prefix}{name}"


def loaded_meta(args) -> dict | None:
    conn = _connect(args)
    try:
        cur = conn.cursor()
        cur.execute("SELECT k, v FROM `%sorg`.bench_meta" % args.prefix)
        return dict(cur.fetchall())
    except Exception:
        return None
    finally:
        conn.close()


def load(args) -> dict:
    """Create the six databases and the read-only user and load the rows; returns timings and row counts."""
    want = {"generator": GENERATOR_VERSION, "warehouses": str(args.warehouses), "seed": str(args.seed),
            "payments": str(args.payments)}
    meta = loaded_meta(args)
    if meta and all(meta.get(k) == v for k, v in want.items()) and not args.force:
        return {"skipped": True, "meta": meta}
    conn = _connect(args, local_infile=args.method == "infile")
    cur = conn.cursor()
    started = time.perf_counter()
    for name in DATABASES:
        db = db_name(args.prefix, name)
        cur.execute(f"DROP DATABASE IF EXISTS `{db}`")
        cur.execute(f"CREATE DATABASE `{db}` CHARACTER SET utf8mb4")
        for ddl in SCHEMA[name]:
            cur.execute(f"USE `{db}`")
            cur.execute(ddl)
    cur.execute("SET SESSION unique_checks = 0, foreign_key_checks = 0")
    counts, timings = {}, {}
    tmp = tempfile.mkdtemp(prefix="qag-tpcc-")
    for database, table, rows in generate(args.warehouses, args.seed, args.payments):
        t0 = time.perf_counter()
        full = f"`{db_name(args.prefix, database)}`.`{table}`"
        n = 0
        if args.method == "infile":
            path = os.path.join(tmp, f"{database}.{table}.tsv")
            with open(path, "w", encoding="utf-8") as fh:
                for row in rows:
                    fh.write("\t".join(map(_tsv_value, row)))
                    fh.write("\n")
                    n += 1
            cur.execute(f"LOAD DATA LOCAL INFILE %s INTO TABLE {full} CHARACTER SET utf8mb4 "
                        "FIELDS TERMINATED BY '\\t' LINES TERMINATED BY '\\n'", (path,))
            os.remove(path)
        else:
            batch: list[tuple] = []
            sql = None
            for row in rows:
                if sql is None:
                    sql = f"INSERT INTO {full} VALUES ({', '.join(['%s'] * len(row))})"
                batch.append(row)
                if len(batch) == 2000:
                    cur.executemany(sql, batch)   # mysqlclient sends one multi-row INSERT per batch
                    n += len(batch)
                    batch = []
            if batch:
                cur.executemany(sql, batch)
                n += len(batch)
        counts[f"{database}.{table}"] = n
        timings[f"{database}.{table}"] = round(time.perf_counter() - t0, 2)
    os.rmdir(tmp)
    t0 = time.perf_counter()
    for ddl in INDEXES:
        cur.execute(ddl.format(p=args.prefix))
    timings["indexes"] = round(time.perf_counter() - t0, 2)
    for host in ("%", "localhost"):
        who = f"'{RO_USER}'@'{host.replace('%', '%%')}'"   # %-escaped: these statements take arguments
        cur.execute(f"CREATE USER IF NOT EXISTS {who} IDENTIFIED BY %s", (RO_PASSWORD,))
        cur.execute(f"ALTER USER {who} IDENTIFIED BY %s", (RO_PASSWORD,))
        for name in DATABASES:
            cur.execute(f"GRANT SELECT ON `{db_name(args.prefix, name)}`.* TO '{RO_USER}'@'{host}'")
    for k, v in want.items():
        cur.execute(f"REPLACE INTO `{args.prefix}org`.bench_meta VALUES (%s, %s)", (k, v))
    cur.execute("ANALYZE TABLE " + ", ".join(f"`{args.prefix}{d}`.`{t}`" for d, t in TABLES))
    cur.fetchall()
    conn.close()
    return {"skipped": False, "method": args.method, "seconds": round(time.perf_counter() - started, 1),
            "rows": counts, "table_seconds": timings}


# --- the saved queries -----------------------------------------------------------------------------------
def queries(warehouses: int, prefix: str = "") -> tuple[Query, ...]:
    p = prefix
    key = {"w": {"type": "int", "required": True, "min": 1, "max": warehouses, "description": "warehouse"},
           "d": {"type": "int", "required": True, "min": 1, "max": DISTRICTS, "description": "district"},
           "c": {"type": "int", "required": True, "min": 1, "max": CUSTOMERS, "description": "customer"}}
    cust_check = (("c_w_id", "w"), ("c_d_id", "d"), ("c_id", "c"))
    history = (f"SELECT o.o_w_id AS c_w_id, o.o_d_id AS c_d_id, o.o_c_id AS c_id, o.o_id, o.o_entry_d, ol.ol_number,\n"
               f"       ol.ol_i_id, i.i_name, ol.ol_quantity, ol.ol_amount\n"
               f"FROM {p}orders.orders o\n"
               f"JOIN {p}orders.order_line ol ON ol.ol_w_id = o.o_w_id AND ol.ol_d_id = o.o_d_id "
               f"AND ol.ol_o_id = o.o_id\n"
               f"JOIN {p}catalog.item i ON i.i_id = ol.ol_i_id\n"
               f"WHERE o.o_w_id = :w AND o.o_d_id = :d AND o.o_c_id = :c\n"
               f"ORDER BY o.o_id DESC, ol.ol_number LIMIT 50")
    return (
        Query("customer", "One customer by (warehouse, district, customer)",
              f"SELECT c_w_id, c_d_id, c_id, c_first, c_middle, c_last, c_street_1, c_city, c_state, c_zip, c_phone,\n"
              f"       c_since, c_credit, c_credit_lim, c_discount, c_balance, c_ytd_payment, c_payment_cnt\n"
              f"FROM {p}crm.customer WHERE c_w_id = :w AND c_d_id = :d AND c_id = :c", key, cust_check),
        Query("order_status", "TPC-C Order-Status: the customer's balance and last order with its lines",
              f"SELECT c.c_w_id, c.c_d_id, c.c_id, c.c_first, c.c_middle, c.c_last, c.c_balance,\n"
              f"       o.o_id, o.o_entry_d, o.o_carrier_id, ol.ol_number, ol.ol_i_id, ol.ol_supply_w_id,\n"
              f"       ol.ol_quantity, ol.ol_amount, ol.ol_delivery_d\n"
              f"FROM {p}crm.customer c\n"
              f"JOIN {p}orders.orders o ON o.o_w_id = c.c_w_id AND o.o_d_id = c.c_d_id AND o.o_c_id = c.c_id\n"
              f" AND o.o_id = (SELECT max(o2.o_id) FROM {p}orders.orders o2\n"
              f"               WHERE o2.o_w_id = :w AND o2.o_d_id = :d AND o2.o_c_id = :c)\n"
              f"JOIN {p}orders.order_line ol ON ol.ol_w_id = o.o_w_id AND ol.ol_d_id = o.o_d_id AND ol.ol_o_id = o.o_id\n"
              f"WHERE c.c_w_id = :w AND c.c_d_id = :d AND c.c_id = :c\nORDER BY ol.ol_number",
              key, cust_check, {"page_size": 100}),
        Query("order_history", "The lines of the customer's latest orders with item names (up to 50 lines)",
              history, key, cust_check, {"page_size": 50}),
        Query("order_history_stream", "The same lines as a stream (stream=true, NDJSON)",
              history, key, cust_check, {"stream": "true", "format": "ndjson"}, mixed=False),
        Query("payments", "The customer's last 20 payments",
              f"SELECT h_c_w_id AS c_w_id, h_c_d_id AS c_d_id, h_c_id AS c_id, h_date, h_amount, h_w_id, h_d_id, h_data\n"
              f"FROM {p}billing.history WHERE h_c_w_id = :w AND h_c_d_id = :d AND h_c_id = :c\n"
              f"ORDER BY h_date DESC LIMIT 20", key, cust_check, {"page_size": 20}),
        Query("profile", "The customer with their district and warehouse",
              f"SELECT c.c_w_id, c.c_d_id, c.c_id, c.c_first, c.c_last, c.c_credit, c.c_discount, c.c_balance,\n"
              f"       d.d_name, d.d_city, d.d_tax, w.w_name, w.w_city, w.w_tax\n"
              f"FROM {p}crm.customer c\n"
              f"JOIN {p}org.district d ON d.d_w_id = c.c_w_id AND d.d_id = c.c_d_id\n"
              f"JOIN {p}org.warehouse w ON w.w_id = c.c_w_id\n"
              f"WHERE c.c_w_id = :w AND c.c_d_id = :d AND c.c_id = :c", key, cust_check),
        Query("stock_level", "TPC-C Stock-Level: distinct items under a threshold in the district's last 20 orders",
              f"SELECT d.d_w_id AS w_id, d.d_id, count(DISTINCT s.s_i_id) AS low_stock\n"
              f"FROM {p}org.district d\n"
              f"LEFT JOIN {p}orders.order_line ol ON ol.ol_w_id = d.d_w_id AND ol.ol_d_id = d.d_id\n"
              f"     AND ol.ol_o_id < d.d_next_o_id AND ol.ol_o_id >= d.d_next_o_id - 20\n"
              f"LEFT JOIN {p}inventory.stock s ON s.s_w_id = ol.ol_w_id AND s.s_i_id = ol.ol_i_id\n"
              f"     AND s.s_quantity < :threshold\n"
              f"WHERE d.d_w_id = :w AND d.d_id = :d\nGROUP BY d.d_w_id, d.d_id",
              {"w": key["w"], "d": key["d"],
               "threshold": {"type": "int", "default": 15, "min": 10, "max": 20, "description": "stock threshold"}},
              (("w_id", "w"), ("d_id", "d")), {"threshold": 15}),
    )


def case(args) -> Case:
    space = KeySpace((("w", args.warehouses), ("d", DISTRICTS), ("c", CUSTOMERS)))
    space.check()
    conn = {"name": "tpcc", "db": "mysql", "host": args.host, "port": args.port, "database": f"{args.prefix}crm",
            "user": RO_USER, "password": RO_PASSWORD}
    direct = {"kind": "mysql", "host": args.host, "port": args.port, "user": RO_USER, "password": RO_PASSWORD,
              "database": f"{args.prefix}crm"}
    # The governed key: every table the queries read, and a mask on personal columns.
    tables = [f"{args.prefix}{d}.{t}" for d, t in TABLES]
    governed = {"allowed_tables": tables,
                "mask": [{"column": "customer.c_phone", "action": "mask"},
                         {"column": "customer.c_street_1", "action": "hash"}]}
    return Case("tpcc", "mysql", space, queries(args.warehouses, args.prefix), conn, direct, governed=governed)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("MySQL (TPC-C case)")
    g.add_argument("--warehouses", type=int, default=2, help="TPC-C warehouses W (default 2)")
    g.add_argument("--seed", type=int, default=8, help="generator seed (default 8)")
    g.add_argument("--payments", type=int, default=5, help="history rows per customer (default 5)")
    g.add_argument("--prefix", default="", help="prefix of the six database names (default none)")
    g.add_argument("--host", default=os.environ.get("QAG_BENCH_MYSQL_HOST", "127.0.0.1"))
    g.add_argument("--port", type=int, default=int(os.environ.get("QAG_BENCH_MYSQL_PORT", "3306")))
    g.add_argument("--user", default=os.environ.get("QAG_BENCH_MYSQL_USER", "root"), help="an account that may "
                   "create databases and users (only for loading)")
    g.add_argument("--password", default=os.environ.get("QAG_BENCH_MYSQL_PASSWORD", ""))
    g.add_argument("--load-method", dest="method", choices=("infile", "insert"), default="infile",
                   help="LOAD DATA LOCAL INFILE (default) or multi-row INSERTs")
    g.add_argument("--reload", dest="force", action="store_true",
                   help="drop and reload the case's data even when already loaded")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    result = load(args)
    import json
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
