"""HTTP conventions without a server: Accept parsing, problem details, the Allow and WWW-Authenticate headers."""

from __future__ import annotations

import json

import pytest

from qag.auth import API_KEY_CHALLENGE, Authenticator
from qag.errors import ERRORS, QagError
from qag.http import negotiate
from qag.http.negotiate import format_for, media_ranges, quality, wants_problem
from qag.http.response import error_response
from qag.http.router import Router, allow_header

CHROME = ("text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,image/apng,*/*;q=0.8,"
          "application/signed-exchange;v=b3;q=0.7")
FIREFOX = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
SAFARI = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


def header(response, name):
    return [v for k, v in response.headers if k.lower() == name.lower()]


# --- Accept parsing -----------------------------------------------------------------------------------------------

class TestMediaRanges:
    def test_types_lower_cased_with_their_q(self):
        assert media_ranges("Text/CSV; charset=utf-8; q=0.5 , */*;q=0") == [("text/csv", 0.5), ("*/*", 0.0)]

    def test_default_q_is_one(self):
        assert media_ranges("application/json") == [("application/json", 1.0)]

    @pytest.mark.parametrize("accept", ["text/csv;q=2", "text/csv;q=1.5", "text/csv;q=-1", "text/csv;q=abc",
                                        "text/csv;q=0.1234", "text/csv;q=", "text/csv;q=.5"])
    def test_a_range_with_a_malformed_q_is_dropped(self, accept):
        assert media_ranges(accept) == []

    @pytest.mark.parametrize("accept", ["", ",", "csv", "text/", "/csv", "text", ";q=1", "  ,  ; "])
    def test_junk_selects_nothing(self, accept):
        assert media_ranges(accept) == []

    def test_q_after_accept_ext_is_not_read(self):
        # q ends the media type's parameters; what follows it is accept-ext
        assert media_ranges("text/csv;q=0.3;q=1") == [("text/csv", 0.3)]

    def test_most_specific_range_decides(self):
        ranges = media_ranges("*/*;q=0.1, application/*;q=0.2, application/json;q=0.3")
        assert quality(ranges, "application/json") == (0.3, 2)
        assert quality(ranges, "application/xml") == (0.2, 1)
        assert quality(ranges, "text/csv") == (0.1, 0)
        assert quality(media_ranges("text/csv"), "application/json") == (0.0, -1)


class TestWantsProblem:
    @pytest.mark.parametrize("accept", [
        "application/problem+json", "APPLICATION/Problem+JSON", "application/problem+json;q=0.5",
        "application/problem+json, application/json", "application/json;q=0.5, application/problem+json",
        "application/problem+json, */*", "application/problem+json; charset=utf-8",
    ])
    def test_selected_when_named_and_liked_at_least_as_much_as_json(self, accept):
        assert wants_problem(accept)

    @pytest.mark.parametrize("accept", [
        None, "", "*/*", "application/*", "application/json", "text/csv", CHROME,
        "application/problem+json;q=0", "application/problem+json;q=0.000",
        "application/json, application/problem+json;q=0.5", "application/problem+json;q=abc",
        "application/problem+xml", "application/problemjson", "application/problem+json2",
    ])
    def test_not_selected(self, accept):
        assert not wants_problem(accept)


class TestFormatFor:
    @pytest.mark.parametrize("accept, fmt", [
        ("text/csv", "csv"), ("text/csv; charset=utf-8", "csv"), ("TEXT/CSV", "csv"),
        ("text/tab-separated-values", "tsv"), ("application/x-ndjson", "ndjson"), ("application/xml", "xml"),
        ("application/x-yaml", "yaml"), ("application/vnd.apache.parquet", "parquet"),
        ("application/vnd.openxmlformats-officedocument.spreadsheetml.sheet", "xlsx"),
        ("text/csv, application/json;q=0.5", "csv"),
        ("text/csv, */*;q=0.1", "csv"),
        ("application/json;q=0, text/csv;q=0.1", "csv"),
        ("text/csv;q=0.4, text/tab-separated-values;q=0.6", "tsv"),
        ("text/csv, text/tab-separated-values", "csv"),           # a tie: the first listed
        ("text/csv, text/html;q=0.5", "csv"),                     # html liked less than csv: not a browser
    ])
    def test_a_format_named_by_its_media_type(self, accept, fmt):
        assert format_for(accept) == fmt

    @pytest.mark.parametrize("accept", [
        "*/*", "application/json", "application/*", "text/*", "application/json, text/csv",
        "text/csv, application/json", "text/csv;q=0.5, */*", "text/csv;q=0", "text/csv;q=0, text/csv",
        "text/html", "text/plain", "application/problem+json", "application/yaml", "text/xml", "", "garbage",
        CHROME, FIREFOX, SAFARI, "text/html, text/csv",
    ])
    def test_json_kept(self, accept):
        assert format_for(accept) is None

    def test_memo_is_bounded_and_skips_long_values(self, monkeypatch):
        monkeypatch.setattr(negotiate, "_MEMO", {})
        for i in range(negotiate._MEMO_MAX + 10):
            assert format_for(f"text/csv;x={i}") == "csv"
        assert len(negotiate._MEMO) <= negotiate._MEMO_MAX
        long = "text/csv;" + "x" * 600
        assert format_for(long) == "csv" and long not in negotiate._MEMO

    def test_a_format_whose_package_is_missing_is_not_offered(self, monkeypatch):
        from qag import formats
        from qag.api.run import _negotiated_format

        def missing(fmt):
            if fmt == "yaml":
                raise QagError("format_unavailable")
        monkeypatch.setattr(formats, "check_available", missing)
        monkeypatch.setattr(negotiate, "_MEMO", {})   # answers depend on what this process can write
        assert _negotiated_format("application/x-yaml") == "json"
        assert _negotiated_format("application/x-yaml, text/csv;q=0.5") == "csv"   # the next one liked
        assert _negotiated_format("application/x-yaml, text/csv;q=0.5, */*;q=0.6") == "json"
        assert _negotiated_format("text/csv") == "csv"

    def test_every_served_format_is_reachable(self):
        from qag.encode import CONTENT_TYPES
        assert set(negotiate.MEDIA_FORMATS.values()) == set(CONTENT_TYPES)


# --- problem details ----------------------------------------------------------------------------------------------

class TestProblemDetails:
    def test_members_and_order(self):
        error = QagError("param_invalid", "Invalid parameters: id must be an integer",
                         errors={"id": "must be an integer"})
        assert list(error.problem("abc").items()) == [
            ("type", "about:blank"), ("title", "Bad Request"), ("status", 400),
            ("detail", "Invalid parameters: id must be an integer"), ("code", "param_invalid"),
            ("errors", {"id": "must be an integer"}), ("request_id", "abc")]

    def test_driver_detail_renamed_other_extras_kept_in_order(self):
        error = QagError("connection_failed", detail="refused", retry_after=2)
        body = error.problem("r1")
        assert body["detail"] == "Could not connect to the database"
        assert list(body)[4:] == ["code", "driver_detail", "retry_after", "request_id"]
        assert body["driver_detail"] == "refused" and body["retry_after"] == 2 and body["status"] == 502

    @pytest.mark.parametrize("code", sorted(ERRORS))
    def test_title_is_the_status_phrase_for_every_code(self, code):
        status = ERRORS[code][0]
        body = QagError(code).problem("r")
        assert body["status"] == status and body["title"] and body["title"] != "Error"
        assert body["type"] == "about:blank" and "instance" not in body and "error" not in body

    def test_envelope_unchanged(self):
        error = QagError("query_failed", detail="no such table: x")
        assert error.envelope("r") == {"error": "An error occurred while executing the SQL query",
                                       "code": "query_failed", "detail": "no such table: x", "request_id": "r"}


class TestErrorResponse:
    ENVELOPE = b'{"error":"Saved query \'x\' not found","code":"query_not_found","request_id":"rid"}\n'

    @pytest.mark.parametrize("accept", [None, "*/*", "application/json", "application/*", CHROME,
                                        "application/problem+json;q=0", "text/csv"])
    def test_envelope_byte_for_byte_without_a_named_problem_accept(self, accept):
        response = error_response(QagError("query_not_found", "Saved query 'x' not found"), "rid", accept)
        assert response.body == self.ENVELOPE
        assert header(response, "Content-Type") == ["application/json"]
        assert header(response, "Vary") == ["Accept"]

    def test_problem_json(self):
        response = error_response(QagError("query_not_found", "Saved query 'x' not found"), "rid",
                                  "application/problem+json")
        assert response.status == 404
        assert header(response, "Content-Type") == ["application/problem+json"]
        assert header(response, "Vary") == ["Accept"]
        assert response.body.endswith(b"\n") and b": " not in response.body  # compact like the envelope
        assert json.loads(response.body) == {"type": "about:blank", "title": "Not Found", "status": 404,
                                             "detail": "Saved query 'x' not found", "code": "query_not_found",
                                             "request_id": "rid"}

    def test_non_ascii_escaped_as_in_the_envelope(self):
        response = error_response(QagError("query_not_found", "Saved query 'é' not found"), "r",
                                  "application/problem+json")
        assert b"\\u00e9" in response.body and response.body.isascii()

    def test_headers_of_the_error_kept(self):
        error = QagError("unauthorized", headers=[("WWW-Authenticate", API_KEY_CHALLENGE)])
        for accept in (None, "application/problem+json"):
            assert header(error_response(error, "r", accept), "WWW-Authenticate") == [API_KEY_CHALLENGE]
        assert error.headers == [("WWW-Authenticate", API_KEY_CHALLENGE)]  # the error itself is not changed

    def test_retry_after_header_for_both_shapes(self):
        error = QagError("rate_limited", retry_after=7)
        for accept in (None, "application/problem+json"):
            response = error_response(error, "r", accept)
            assert header(response, "Retry-After") == ["7"]
            assert json.loads(response.body)["retry_after"] == 7


# --- Allow and WWW-Authenticate -----------------------------------------------------------------------------------

def _router() -> Router:
    router = Router()
    noop = lambda *a, **k: None  # noqa: E731
    router.add("GET POST", "/q/<name>", noop, "run")
    router.add("POST", "/api/v1/connections/test", noop, "test")
    router.add("GET PATCH DELETE", "/api/v1/connections/<name>", noop, "one")
    router.add("GET", "/health", noop, "health")
    router.add("DELETE", "/api/v1/api-keys/<name>/previous", noop, "previous")
    return router


class TestAllow:
    @pytest.mark.parametrize("path, method, allow", [
        ("/q/x", "DELETE", "GET, HEAD, POST"),
        ("/q/x", "PUT", "GET, HEAD, POST"),
        ("/q/x", "OPTIONS", "GET, HEAD, POST"),
        ("/health", "POST", "GET, HEAD"),
        # two routes fit the path: every method that reaches one of them
        ("/api/v1/connections/test", "PUT", "GET, HEAD, POST, PATCH, DELETE"),
        ("/api/v1/connections/other", "POST", "GET, HEAD, PATCH, DELETE"),
        ("/api/v1/api-keys/k/previous", "GET", "DELETE"),
    ])
    def test_405_names_the_methods(self, path, method, allow):
        with pytest.raises(QagError) as caught:
            _router().match(path.strip("/").split("/"), method)
        assert caught.value.status == 405 and caught.value.code == "method_not_allowed"
        assert caught.value.headers == [("Allow", allow)]

    def test_head_is_served_for_get_and_404_has_no_allow(self):
        router = _router()
        assert router.match(["health"], "HEAD")[0].endpoint == "health"
        assert router.match(["api", "v1", "connections", "test"], "GET")[0].endpoint == "one"
        with pytest.raises(QagError) as caught:
            router.match(["nope"], "GET")
        assert caught.value.status == 404 and caught.value.headers == []

    def test_allow_header_order(self):
        assert allow_header(frozenset({"DELETE", "GET", "POST", "PATCH"})) == "GET, HEAD, POST, PATCH, DELETE"
        assert allow_header({"POST"}) == "POST"
        assert allow_header({"POST", "PROPFIND"}) == "POST, PROPFIND"


class _NoKeys:
    def count_keys(self):
        return 0


def test_challenge_headers():
    auth = Authenticator(_NoKeys(), "admin-key")
    assert auth.challenges == (("WWW-Authenticate", 'ApiKey realm="qag", name="X-API-Key", in="header"'),)
