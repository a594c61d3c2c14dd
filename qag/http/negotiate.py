"""Accept-header negotiation (RFC 9110 12.5.1): problem details for an error, a run's format when none is named."""

from __future__ import annotations

import re

from ..encode import CONTENT_TYPES

PROBLEM_JSON = "application/problem+json"
# The media type each output format is served with (parameters dropped) -> its format name.
MEDIA_FORMATS = {content_type.split(";", 1)[0].strip(): fmt for fmt, content_type in CONTENT_TYPES.items()}
_JSON = "application/json"
_QVALUE = re.compile(r"0(\.[0-9]{0,3})?|1(\.0{0,3})?")
_MEMO: dict[str, str | None] = {}
_MEMO_MAX = 256          # distinct Accept values remembered (clients send a handful; then it starts over)
_MEMO_LONGEST = 512      # longer values are worked out every time rather than kept


def media_ranges(accept: str) -> list[tuple[str, float]]:
    """(type/subtype lower-cased, q) per media range, in the order sent. A range that is not `type/subtype` or whose
    q is not an RFC 9110 qvalue is dropped: a malformed Accept never fails a request, it only selects nothing."""
    ranges = []
    for part in accept.split(","):
        media, *params = part.split(";")
        media = media.strip().lower()
        kind, slash, sub = media.partition("/")
        if not slash or not kind or not sub:
            continue
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                value = value.strip()
                q = float(value) if _QVALUE.fullmatch(value) else -1.0
                break   # what follows q is accept-ext, not media-type parameters
        if q >= 0:
            ranges.append((media, q))
    return ranges


def quality(ranges: list[tuple[str, float]], media: str) -> tuple[float, int]:
    """(q, specificity) the ranges give `media`: the most specific matching range decides (2 exact, 1 `type/*`,
    0 `*/*`, -1 and q 0 when none matches)."""
    group = media.partition("/")[0] + "/*"
    best_q, best = 0.0, -1
    for name, q in ranges:
        if name == media:
            specificity = 2
        elif name == group:
            specificity = 1
        elif name == "*/*":
            specificity = 0
        else:
            continue
        if specificity > best:
            best_q, best = q, specificity
    return best_q, best


def wants_problem(accept: str | None) -> bool:
    """True when the client names application/problem+json with q > 0 and likes it at least as much as plain
    application/json. A wildcard (`*/*`, `application/*`) never selects it: a client must ask for RFC 9457 by name,
    so every other client keeps the contract's envelope."""
    if not accept or "problem" not in accept.lower():
        return False
    ranges = media_ranges(accept)
    q, specificity = quality(ranges, PROBLEM_JSON)
    if specificity != 2 or q <= 0:
        return False
    return q >= quality(ranges, _JSON)[0]


def format_for(accept: str, usable=None) -> str | None:
    """The output format an Accept header asks for, or None for the default (JSON); remembered per value.

    Only a format's exact media type selects it (`text/*` could be csv or tsv); it must be liked more than JSON
    (which `application/*` and `*/*` also reach), so `*/*`, `application/json, text/csv` and the like keep JSON.
    An Accept that likes text/html at least as much as a format is a browser's (they list application/xml at
    q=0.9) and keeps JSON for it. Ties between formats go to the one listed first. `usable(fmt)` says whether this
    server can write a format (its package may be missing); one it can't is passed over for the next. It must not
    change within a process: the answer is remembered."""
    known = _MEMO.get(accept, False)
    if known is not False:
        return known
    chosen = _choose(accept, usable)
    if len(accept) <= _MEMO_LONGEST:
        if len(_MEMO) >= _MEMO_MAX:
            _MEMO.clear()
        _MEMO[accept] = chosen
    return chosen


def _choose(accept: str, usable) -> str | None:
    ranges = media_ranges(accept)
    candidates, seen = [], set()
    for index, (media, q) in enumerate(ranges):
        fmt = MEDIA_FORMATS.get(media)
        if fmt is None or fmt == "json" or media in seen:
            continue
        seen.add(media)   # a type listed twice: its first range counts, as for every other type
        candidates.append((-q, index, fmt))
    if not candidates:
        return None
    json_q = quality(ranges, _JSON)[0]
    html_q, html_specificity = quality(ranges, "text/html")
    for negative_q, _, fmt in sorted(candidates):
        q = -negative_q
        if q <= json_q or (html_specificity == 2 and html_q >= q):
            return None   # from here on every format is liked no more than JSON (or than HTML)
        if usable is None or usable(fmt):
            return fmt
    return None
