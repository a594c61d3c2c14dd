"""Pure twin of the simple-head reader: complete request heads of the plainest kind, taken without llhttp.

`take(data, limits, ready)` reads requests from the start of `data` (bytes at a request boundary) while each is
a complete head of this grammar, and appends them to `ready`:

    ("GET" | "HEAD") SP "/" *(%x21-22 / %x24-7E) SP "HTTP/1." ("0" / "1") CRLF
    *( token ":" *(HTAB / %x20-7E) CRLF ) CRLF

with no Content-Length, Transfer-Encoding, Upgrade or Expect field (those frame a body or switch protocols:
llhttp acts on them itself). That is a subset of what llhttp and the pure parser accept, and each head then goes
through the same rules as theirs (qag/http11.py: check_line, add_header, headers_done), so limits give
the same refusals (HttpError). It returns `(used, dead)`: the bytes taken, and whether the connection ends with
the last request taken (Connection: close, HTTP/1.0); the caller hands the rest of `data` to llhttp.
"""

from __future__ import annotations

import re

from qag.http11 import Request, add_header, check_line, headers_done

_HEAD = re.compile(rb"(GET|HEAD) (/[\x21\x22\x24-\x7e]*) HTTP/1\.([01])\r\n"
                   rb"((?:[!#$%&'*+\-.0-9A-Z^_`a-z|~]+:[\t\x20-\x7e]*\r\n)*)\r\n")
_FIELD = re.compile(rb"([^:]+):[ \t]*(.*)")
_LEFT_TO_LLHTTP = frozenset((b"content-length", b"transfer-encoding", b"upgrade", b"expect"))


def take(data: bytes, limits, ready) -> tuple[int, bool]:
    pos = 0
    while True:
        m = _HEAD.match(data, pos)
        if m is None:
            return pos, False
        method, url, minor, block = m.groups()
        fields = [_FIELD.fullmatch(line).groups() for line in block.split(b"\r\n")[:-1]]
        if any(name.lower() in _LEFT_TO_LLHTTP for name, _ in fields):
            return pos, False
        name = method.decode("ascii")
        check_line(name, len(url), limits)
        req = Request(name, url.decode("latin-1"))
        for field, value in fields:
            add_header(req, field, value, limits)
        headers_done(req, 1, int(minor), limits)
        ready.append(req)
        pos = m.end()
        if not req.keep_alive:
            return pos, True
