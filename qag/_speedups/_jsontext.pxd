# cython: language_level=3
"""A database's text of a value as the JSON rowjson would write for it, and JSON's escapes: shared by the compiled
drivers that write a page's JSON themselves (_pgpipe, _myresult) and by _rowjson (escape); inline, so each has its
own copy of the code.

The tests say when the text is what rowjson writes (plain text, canonical ints) and escape UTF-8 text as rowjson
escapes the str it decodes to; a value they refuse makes the driver hand its rows to rowjson instead."""

from libc.stdint cimport uint32_t, uint64_t
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


# Python's strict UTF-8 decoder's well-formed sequences (RFC 3629: no overlong forms, no surrogates, nothing past
# U+10FFFF): the second byte's range by the first byte; the rest are 80-BF.
cdef inline int utf8_length(const unsigned char *t, Py_ssize_t left, uint32_t *code) noexcept:
    """The length of the well-formed UTF-8 sequence at `t` (its code point in `code`), 0 when it isn't one."""
    cdef unsigned char c = t[0]
    cdef unsigned char low = 0x80, high = 0xBF
    cdef int n, k
    if c < 0x80:
        code[0] = c
        return 1
    if 0xC2 <= c <= 0xDF:
        n, code[0] = 2, c & 0x1F
    elif 0xE0 <= c <= 0xEF:
        n, code[0] = 3, c & 0x0F
        if c == 0xE0:
            low = 0xA0
        elif c == 0xED:
            high = 0x9F
    elif 0xF0 <= c <= 0xF4:
        n, code[0] = 4, c & 0x07
        if c == 0xF0:
            low = 0x90
        elif c == 0xF4:
            high = 0x8F
    else:
        return 0
    if left < n or not low <= t[1] <= high:
        return 0
    for k in range(1, n):
        if k > 1 and not 0x80 <= t[k] <= 0xBF:
            return 0
        code[0] = (code[0] << 6) | (t[k] & 0x3F)
    return n


cdef inline char short_escape(uint32_t code) noexcept:
    """The letter json.dumps (ensure_ascii) writes after a backslash for this code point ('"', '\\', b, t, n, f, r),
    0 for any other."""
    cdef const char *control = b"\0\0\0\0\0\0\0\0btn\0fr"      # U+0008 to U+000D, U+000B excepted
    if code < 14:
        return control[code]
    return <char>code if code == 0x22 or code == 0x5C else 0


cdef inline char *_u4(char *o, uint32_t code) noexcept:
    cdef const char *hex_digits = b"0123456789abcdef"
    o[0] = b'\\'
    o[1] = b'u'
    o[2] = hex_digits[(code >> 12) & 15]
    o[3] = hex_digits[(code >> 8) & 15]
    o[4] = hex_digits[(code >> 4) & 15]
    o[5] = hex_digits[code & 15]
    return o + 6


cdef inline char *escape(char *o, uint32_t code) noexcept:
    """A code point written at `o` as json.dumps (ensure_ascii) escapes it: by name (short_escape), else as \\uXXXX
    (lowercase; past U+FFFF as its surrogate pair); the end."""
    cdef char letter = short_escape(code)
    if letter:
        o[0] = b'\\'
        o[1] = letter
        return o + 2
    if code < 0x10000:
        return _u4(o, code)
    code -= 0x10000
    return _u4(_u4(o, 0xD800 | (code >> 10)), 0xDC00 | (code & 0x3FF))


cdef inline Py_ssize_t escaped_size(const char *text, Py_ssize_t length) noexcept:
    """The size of the JSON string, quotes included, rowjson writes for the str these UTF-8 bytes decode to
    (json.dumps, ensure_ascii: printable ASCII but '"' and '\\' as it is, the rest by `escape`); -1 when Python's
    strict decoder refuses them."""
    cdef Py_ssize_t i = 0, size = 2
    cdef int n
    cdef uint32_t code
    cdef unsigned char c
    while i < length:
        c = <unsigned char>text[i]
        if 0x20 <= c <= 0x7E:
            size += 2 if c == 0x22 or c == 0x5C else 1
            i += 1
            continue
        n = utf8_length(<const unsigned char *>text + i, length - i, &code)
        if n == 0:
            return -1
        i += n
        size += 2 if short_escape(code) else 12 if code > 0xFFFF else 6
    return size


cdef inline char *write_escaped(char *o, const char *text, Py_ssize_t length) noexcept:
    """The JSON string of escaped_size written at `o`; the end. Only for bytes escaped_size accepted (on others
    utf8_length reads no sequence and this wouldn't end), into room for the size it gave."""
    cdef Py_ssize_t i = 0, start
    cdef uint32_t code
    cdef unsigned char c
    o[0] = b'"'
    o += 1
    while i < length:
        start = i
        while i < length:
            c = <unsigned char>text[i]
            if c < 0x20 or c > 0x7E or c == 0x22 or c == 0x5C:
                break
            i += 1
        if i > start:
            memcpy(o, text + start, i - start)
            o += i - start
        if i == length:
            break
        i += utf8_length(<const unsigned char *>text + i, length - i, &code)
        o = escape(o, code)
    o[0] = b'"'
    return o + 1
