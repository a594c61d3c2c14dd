"""Request.header (qag/http/request.py): a header read by its environ key, also once its name is remembered."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from qag.http.request import Request


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["X-API-Key", "x-api-key", "Authorization", "If-None-Match", "if_none_match",
                        "MCP-Protocol-Version"]) | st.text(alphabet="aZ-_1é", max_size=6))
def test_a_header_is_read_by_its_environ_key(name):
    key = "HTTP_" + name.upper().replace("-", "_")
    request = Request({"REQUEST_METHOD": "GET", key: "v"}, 1024)
    assert request.header(name) == "v" and request.header(name) == "v"   # the second call finds it remembered
    assert Request({"REQUEST_METHOD": "GET", key + "X": "w"}, 1024).header(name) is None
