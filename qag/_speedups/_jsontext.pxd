# cython: language_level=3
"""When a database's text of a value is already the JSON rowjson would write for it: shared by the compiled drivers
that write a page's JSON themselves (_pgpipe, _myresult); inline, so each has its own copy of the code.

These rules only say when the text is what rowjson writes, never how to escape: a value they refuse makes the
driver hand its rows to rowjson instead."""

from libc.stdint cimport uint64_t
from libc.string cimport memcpy


cdef inline bint _no_zero_byte(uint64_t v) noexcept:
    return ((v - 0x0101010101010101ULL) & ~v & 0x8080808080808080ULL) == 0


cdef inline bint plain_text(const char *text, Py_ssize_t length) noexcept:
    """Whether every byte is printable ASCII but '"' and '\\': then rowjson writes the str as these bytes in quotes
    (ensure_ascii, nothing to escape). Eight bytes at a time: a byte at or over 0x7F, under 0x20, '"' or '\\'."""
    cdef Py_ssize_t i = 0
    cdef uint64_t w
    cdef unsigned char c
    while i + 8 <= length:
        memcpy(&w, text + i, 8)
        if ((w & 0x8080808080808080ULL) or ((w + 0x0101010101010101ULL) & 0x8080808080808080ULL)
                or ((w - 0x2020202020202020ULL) & ~w & 0x8080808080808080ULL)):
            return False
        if not (_no_zero_byte(w ^ 0x2222222222222222ULL) and _no_zero_byte(w ^ 0x5C5C5C5C5C5C5C5CULL)):
            return False
        i += 8
    while i < length:
        c = <unsigned char>text[i]
        if c < 0x20 or c > 0x7E or c == 0x22 or c == 0x5C:
            return False
        i += 1
    return True


cdef inline bint canonical_int(const char *text, Py_ssize_t length) noexcept:
    """Whether the text is how Python prints the int it reads as: an optional minus, then 1 to 20 digits, no leading
    zero, not "-0" (PostgreSQL's and MySQL's text of an integer type, but MySQL's ZEROFILL and YEAR 0000)."""
    cdef Py_ssize_t i = 1 if length > 0 and text[0] == b'-' else 0
    cdef Py_ssize_t digits = length - i
    if digits < 1 or digits > 20 or (text[i] == b'0' and (digits > 1 or i == 1)):
        return False
    while i < length:
        if not b'0' <= text[i] <= b'9':
            return False
        i += 1
    return True


cdef inline list json_keys(list unique_names):
    """Each of rowjson's unique column names (unique_columns) as its JSON key with what goes before it (nothing for
    the first, a comma for the others) and its colon, when every name is plain text; None otherwise."""
    cdef list keys = []
    cdef bytes encoded
    for i, name in enumerate(unique_names):
        encoded = name.encode("utf-8")
        if not plain_text(encoded, len(encoded)):
            return None
        keys.append((b"," if i else b"") + b'"' + encoded + b'":')
    return keys
