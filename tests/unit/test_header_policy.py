"""The headers every response gets (contract 0.4-0.6): security headers, request id, CORS; never duplicated."""

from __future__ import annotations

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
