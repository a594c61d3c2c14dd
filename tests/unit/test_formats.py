"""The document formats (qag/formats.py) on their edges: names, types that mix, values beyond a column's type,
parquet streams in row groups, and a missing library refused as 500 format_unavailable before anything runs."""

from __future__ import annotations

import datetime as dt
import importlib
import io
from decimal import Decimal

import pytest

from qag import encode, formats
from qag.errors import QagError


def _needs(module: str):
    """`module` of the formats extra (PyYAML, pyarrow), which a format's test writes or reads back with."""
    return pytest.importorskip(module, reason="the formats extra (pip install 'qag[formats]')")


@pytest.mark.parametrize("column, tag", [("1 id", "_1_id"), ("a b<c>", "a_b_c_"), ("é.x-y", "é.x-y"),
                                         ("_ok", "_ok"), ("-x", "_-x"), ("", "_"),
                                         # \w takes these, XML names don't
                                         ("a²", "a_"), ("ª", "_"), ("µs", "_s"), ("x:y", "x_y")])
def test_xml_names(column, tag):
    assert formats.xml_name(column) == tag


def test_xml_repeated_columns_keep_every_value():
    assert encode.encode("xml", ["id", "id"], [(1, 2)]) == b"<data><item><id>1</id><id_2>2</id_2></item></data>"


def test_xml_is_well_formed_whatever_the_names_and_values():
    """Control characters, U+FFFE and lone surrogates can't be in an XML document even escaped, and names that
    sanitise alike must stay apart: the document parses and every value keeps its own element."""
    import xml.etree.ElementTree as ElementTree
    columns = ["a:b", "a b", "a²", "ª", "v"]
    values = ("a\x01b", "x\ufffey", "\ud800", "tab\tnl\ncr\r", "<&>\x00")
    root = ElementTree.fromstring(encode.encode("xml", columns, [values]))
    item = root.find("item")
    assert [child.tag for child in item] == ["a_b", "a_b_2", "a_", "_", "v"]
    assert [child.text for child in item] == ["a\ufffdb", "x\ufffdy", "\ufffd", "tab\tnl\ncr\n", "<&>\ufffd"]


def test_yaml_writes_a_time_of_day_as_text_and_decimal_nan_as_nan():
    _needs("yaml")
    body = encode.encode("yaml", ["t", "n", "d"], [(dt.time(3, 4, 5), Decimal("NaN"), Decimal("2.50"))])
    assert body == b"- t: 03:04:05\n  n: .nan\n  d: 2.5\n"


def _read(body: bytes):
    return _needs("pyarrow.parquet").read_table(io.BytesIO(body))


def test_parquet_columns_that_mix_types_are_text_and_numbers_widen():
    _needs("pyarrow.parquet")
    body = encode.encode("parquet", ["mixed", "num", "nulls"], [(1, 1, None), ("a", 2.5, None), (None, Decimal("3"), None)])
    table = _read(body)
    assert [str(f.type) for f in table.schema] == ["string", "double", "string"]
    assert table.to_pylist() == [{"mixed": "1", "num": 1.0, "nulls": None}, {"mixed": "a", "num": 2.5, "nulls": None},
                                 {"mixed": None, "num": 3.0, "nulls": None}]


def test_parquet_decimals_beyond_38_digits_are_null_not_an_error():
    _needs("pyarrow.parquet")
    body = encode.encode("parquet", ["d"], [(Decimal("1.5"),), (Decimal("9" * 40),), (Decimal("9" * 36 + ".5"),)])
    assert _read(body).to_pylist() == [{"d": Decimal("1.5")}, {"d": None}, {"d": Decimal("9" * 36 + ".5")}]


def test_parquet_integers_wider_than_64_bits_are_decimals_not_an_error():
    """MySQL's BIGINT UNSIGNED (18446744073709551615) and numeric arithmetic give integers int64 can't hold."""
    _needs("pyarrow.parquet")
    wide = 18446744073709551615
    table = _read(encode.encode("parquet", ["u", "m"], [(wide, -(10 ** 30)), (1, 2)]))
    assert [str(f.type) for f in table.schema] == ["decimal128(38, 0)", "decimal128(38, 0)"]
    assert table.to_pylist() == [{"u": Decimal(wide), "m": Decimal(-(10 ** 30))}, {"u": Decimal(1), "m": Decimal(2)}]
    # an int64 column that meets a wider integer later: NULL, as any value that doesn't fit its column's type
    stream = encode.StreamEncoder("parquet", ["i"], parquet_row_group=1)
    body = b"".join([stream.chunk([(5,)]), stream.chunk([(wide,)]), stream.finish()])
    assert _read(body).to_pylist() == [{"i": 5}, {"i": None}]


def test_a_parquet_stream_keeps_its_first_types_for_later_batches():
    pq = _needs("pyarrow.parquet")
    stream = encode.StreamEncoder("parquet", ["id", "v"], parquet_row_group=2)
    parts = [stream.chunk([(1, "a")]), stream.chunk([(2, "b"), (3, 4)]), stream.chunk([("x", None)]), stream.finish()]
    assert parts[0] == b""                                  # one row held: not a row group yet
    table = pq.ParquetFile(io.BytesIO(b"".join(parts)))
    assert table.metadata.num_row_groups == 2                # four rows in groups of two
    assert table.read().to_pylist() == [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}, {"id": 3, "v": "4"},
                                        {"id": None, "v": None}]


@pytest.mark.parametrize("fmt, package", [("yaml", "yaml"), ("xlsx", "xlsxwriter"), ("parquet", "pyarrow.parquet")])
def test_a_missing_library_is_format_unavailable_when_the_format_is_asked(monkeypatch, fmt, package):
    real = importlib.import_module

    def refuse(name, *args):
        if name == package:
            raise ImportError(f"No module named {name!r}")
        return real(name, *args)
    monkeypatch.setattr(formats.importlib, "import_module", refuse)
    with pytest.raises(QagError) as raised:
        encode.check_format(fmt.upper())
    assert raised.value.code == "format_unavailable" and raised.value.status == 500
    assert encode.check_format("xml") == "xml" and encode.check_format("csv") == "csv"
