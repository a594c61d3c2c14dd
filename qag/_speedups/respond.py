"""Pure twin of the response head's fields: an application's WSGI fields checked, then written, taken or dropped.

`sort_fields(headers)` takes start_response's headers (any iterable of (name, value) pairs) and returns
`(kept, lines, length, close)`, `lines` the Latin-1 bytes the head carries:

* every name must be a str token (RFC 9110) and every value a str of tab, space to tilde, or U+0080 to U+00FF;
  the first bad field raises ValueError naming it ("invalid header name 'X Y'", "invalid value for header
  'X-A'"), before anything is returned;
* hop-by-hop fields (RFC 9110 7.6.1), Date and Server are the server's to write: dropped; Connection is read
  only for "close" (`close`); Content-Length is kept and taken as `length` (int(), which raises ValueError for
  a bad one);
* every other field is kept with its value stripped of spaces and tabs, and written into `lines` as
  "Name: value\\r\\n" in order.

Valid names are remembered with their role (up to 1,024), so an application's usual few are one dict lookup.
"""

from __future__ import annotations

import re

_NAME = re.compile(r"[!#$%&'*+\-.0-9A-Z^_`a-z|~]+")
_VALUE = re.compile(r"[ \t\x21-\x7e\x80-\xff]*")
_HOP = frozenset("connection keep-alive proxy-authenticate proxy-authorization te trailers transfer-encoding "
                 "upgrade server date".split())
WRITE, LENGTH, CONNECTION, DROP = range(4)
_ROLES: dict[str, int] = {}
_KNOWN_LIMIT = 1024


def role(name) -> int:
    """The role of a field name: WRITE, LENGTH, CONNECTION or DROP; ValueError for an invalid name."""
    if type(name) is not str or not _NAME.fullmatch(name):
        raise ValueError(f"invalid header name {name!r}")
    lname = name.lower()
    found = (LENGTH if lname == "content-length" else CONNECTION if lname == "connection"
             else DROP if lname in _HOP else WRITE)
    if len(_ROLES) < _KNOWN_LIMIT:
        _ROLES[name] = found
    return found


def sort_fields(headers) -> tuple[list, bytes, int | None, bool]:
    roles = _ROLES
    kept = []
    lines = []
    length = None
    close = False
    for name, value in headers:
        found = roles.get(name) if type(name) is str else None   # anything else: role() refuses it
        if found is None:
            found = role(name)
        if type(value) is not str or not (value.isprintable() and value.isascii()):
            # printable ASCII (space to tilde) is valid as it is; anything else by the pattern
            if not isinstance(value, str) or not _VALUE.fullmatch(value):
                raise ValueError(f"invalid value for header {name!r}")
        if found == WRITE:
            value = value.strip(" \t")
            kept.append((name, value))
            lines.append(f"{name}: {value}\r\n")
        elif found == LENGTH:
            length = int(value.strip())
            kept.append((name, value.strip(" \t")))
        elif found == CONNECTION and value.strip().lower() == "close":
            close = True
    return kept, "".join(lines).encode("latin-1"), length, close
