"""A MySQL page read and made into JSON, in-process: the rows and rowjson against the reader's own JSON page.

    python -m benchmarks.mysql_pages [--rows 1,10,100] [--rounds 9] [--number 300] [--host 127.0.0.1 ...]

Makes a scratch database on the server (dropped after) with a table shaped like a customer record (ints, short
text, two decimals, a datetime), filled once with ASCII text and once with text to escape (accents, quotes, an
emoji), and for each page size times, on one connection opened as qag opens one (its converter map), what a JSON
page of an unmasked call costs the backend after the statement is sent:

  rows   the compiled reader's read() (values made by mysqlclient's converters), then the compiled rowjson's
         encode_json: the path of a page the reader can't write (and of every page before it could)
  page   the compiled reader's read_page(): the JSON written from the reply's text, no values made

Each round times both in alternating order, as this thread's CPU time (the server's work and the wait for its reply
are not in it; sending the statement and reading the reply from the socket are, in both); the table shows the
median CPU µs a page over the rounds with its min-max range, and whether read_page wrote the page itself.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import time

_COLUMNS = ("id INT PRIMARY KEY, w SMALLINT, first VARCHAR(16), last VARCHAR(16), city VARCHAR(20), "
            "since DATETIME, credit_lim DECIMAL(12,2), balance DECIMAL(12,2), note VARCHAR(40)")
_TEXT = {"ascii": ("Ada", "Lovelace", "London", "paid in full"),
         "escaped": ("José", "Ñúñez-\"Pé\"", "Zürich\\Genève", "paid 😀 in full\n")}


def _fill(admin, database: str, shape: str, rows: int) -> None:
    first, last, city, note = _TEXT[shape]
    cur = admin.cursor()
    cur.execute(f"DELETE FROM `{database}`.page")
    cur.executemany(f"INSERT INTO `{database}`.page VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                    [(i, 1 + i % 10, first, last, city, f"2024-0{1 + i % 9}-1{i % 10} 12:34:56", "50000.00",
                      f"-{i}.{i % 100:02d}", note) for i in range(rows)])


def _cpu(call, number: int) -> float:
    """This thread's CPU µs per call: the reading and encoding, not the server's work or the wait for its reply."""
    started = time.thread_time()
    for _ in range(number):
        call()
    return (time.thread_time() - started) / number * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.mysql_pages", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,10,100", help="page sizes (comma-separated; default 1,10,100)")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds (default 9)")
    parser.add_argument("--number", type=int, default=300, help="pages per timing (default 300)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=3306)
    parser.add_argument("--user", default="root")
    parser.add_argument("--password", default="")
    args = parser.parse_args(argv)

    import MySQLdb

    from qag import _speedups
    from qag.backends.mysql import conversions, connect_args

    try:
        reader_class = _speedups.twin("myresult", "compiled").Reader
        encode_json = _speedups.twin("rowjson", "compiled").encode_json
    except ImportError as exc:
        print(f"the compiled twins are not built ({exc}): python -m build_backend inplace", file=sys.stderr)
        return 2
    admin = MySQLdb.connect(host=args.host, port=args.port, user=args.user, passwd=args.password)
    admin.autocommit(True)
    database = "qag_bench_pages_" + secrets.token_hex(4)
    admin.cursor().execute(f"CREATE DATABASE `{database}` CHARACTER SET utf8mb4")
    try:
        admin.cursor().execute(f"CREATE TABLE `{database}`.page ({_COLUMNS})")
        fields = {"host": args.host, "port": args.port, "user": args.user, "password": args.password,
                  "database": database}
        conn = MySQLdb.connect(**connect_args(fields, True), conv=conversions())
        reader = reader_class(conn)
        print("| text | rows | rows + rowjson CPU µs/page | read_page CPU µs/page | ratio | written by read_page |")
        print("|---|---|---|---|---|---|")
        for shape in _TEXT:
            for n in (int(size) for size in args.rows.split(",")):
                _fill(admin, database, shape, n)
                sql = b"SELECT * FROM page ORDER BY id"

                def rows():
                    reader.query(sql)
                    columns, values = reader.read(0, n + 1)
                    return encode_json(columns, values[:n])

                def page():
                    reader.query(sql)
                    columns, values, json, fetched = reader.read_page(0, n + 1, n)
                    return json if json is not None else encode_json(columns, values[:n])

                assert rows() == page(), "the two paths gave different pages"
                reader.query(sql)
                written = reader.read_page(0, n + 1, n)[2] is not None
                times: dict[str, list[float]] = {"rows": [], "page": []}
                for r in range(args.rounds):
                    for name, call in (("rows", rows), ("page", page))[:: 1 if r % 2 == 0 else -1]:
                        times[name].append(_cpu(call, args.number))
                med = {name: statistics.median(values) for name, values in times.items()}
                cells = [f"{med[name]:.1f} [{min(times[name]):.1f}–{max(times[name]):.1f}]" for name in ("rows", "page")]
                print(f"| {shape} | {n} | {cells[0]} | {cells[1]} | {med['rows'] / med['page']:.2f}× | "
                      f"{'yes' if written else 'no'} |")
        conn.close()
    finally:
        admin.cursor().execute(f"DROP DATABASE IF EXISTS `{database}`")
        admin.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
