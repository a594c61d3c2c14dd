"""The headers every response gets (contract 0.4-0.6): security headers, request id, CORS; never duplicated."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from qag.http.response import HeaderPolicy, Response


def names(headers):
    return [h.lower() for h, _ in headers]


def test_api_response_gets_every_security_header_once():
    headers = HeaderPolicy((), None).finish(Response(200, b"{}", None, "application/json"), "abc123", None, False)
    assert dict(headers) == {"Content-Type": "application/json", "X-Request-Id": "abc123",
                             "X-Content-Type-Options": "nosniff",
                             "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
                             "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}
    assert len(names(headers)) == len(set(names(headers)))


def test_handler_headers_win_and_html_pages_keep_their_own_policy():
    page = Response(200, b"<html>", [("cache-control", "max-age=60"), ("Content-Security-Policy", "default-src 'self'")],
                    "text/html; charset=utf-8")
    headers = HeaderPolicy((), None).finish(page, "r1", None, False)
    assert names(headers).count("cache-control") == 1 and ("cache-control", "max-age=60") in headers
    assert names(headers).count("content-security-policy") == 1
    assert "referrer-policy" not in names(headers)     # an HTML page sets its own, or none
    no_type = HeaderPolicy((), None).finish(Response(204), "r2", None, False)
    assert "content-security-policy" in names(no_type) and "referrer-policy" in names(no_type)


def test_the_first_content_type_decides_and_hsts_and_cors_follow_settings():
    twice = Response(200, b"x", [("Content-Type", "application/json"), ("Content-Type", "text/html")])
    assert "content-security-policy" in names(HeaderPolicy((), None).finish(twice, "r3", None, False))
    policy = HeaderPolicy(("https://app.example",), 600)
    headers = policy.finish(Response(200, b"{}", None, "application/json"), "r4", "https://app.example", True)
    assert ("Strict-Transport-Security", "max-age=600") in headers
    assert ("Access-Control-Allow-Origin", "https://app.example") in headers and ("Vary", "Origin") in headers
    plain = policy.finish(Response(200, b"{}", None, "application/json"), "r5", "https://other.example", False)
    assert "strict-transport-security" not in names(plain) and "access-control-allow-origin" not in names(plain)


def _reference_flags(headers):
    """What finish() looked for before names were remembered: each name lowered on every call."""
    content_type, has_csp, has_referrer, has_cache = None, False, False, False
    for name, value in headers:
        lowered = name.lower()
        if lowered == "content-type":
            content_type = value if content_type is None else content_type
        elif lowered == "cache-control":
            has_cache = True
        elif lowered == "content-security-policy":
            has_csp = True
        elif lowered == "referrer-policy":
            has_referrer = True
    return content_type, has_csp, has_referrer, has_cache


_CASED = ["Content-Type", "content-type", "CONTENT-TYPE", "Cache-Control", "cache-CONTROL",
          "Content-Security-Policy", "content-security-policy", "Referrer-Policy", "REFERRER-POLICY", "X-Page",
          "Vary", "Content-Typo", "Etag"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_CASED) | st.text(max_size=6),
                          st.sampled_from(["text/html", "application/json", "x"])), max_size=6))
def test_remembered_names_decide_as_lowering_each_did(handler_headers):
    # Each list goes through finish() twice: the second call meets every name remembered.
    content_type, has_csp, has_referrer, has_cache = _reference_flags(handler_headers)
    html = content_type is not None and content_type.startswith("text/html")
    for _ in range(2):
        headers = HeaderPolicy((), None).finish(Response(200, b"x", list(handler_headers)), "r", None, False)
        added = headers[len(handler_headers):]
        assert (("Content-Security-Policy", "default-src 'none'; frame-ancestors 'none'") in added) == \
            (not html and not has_csp)
        assert (("Referrer-Policy", "no-referrer") in added) == (not html and not has_referrer)
        assert (("Cache-Control", "no-store") in added) == (not has_cache)
