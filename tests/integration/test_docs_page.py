"""/docs: Swagger UI served by qag itself, rendered by headless Chromium with no network beyond the server."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from qag.api import docs

STATIC = docs.STATIC


class _Tags(HTMLParser):
    """Every element's tag and attributes, and (method, path) of each Swagger UI operation, in document order."""

    def __init__(self):
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.operations: list[tuple[str, str]] = []
        self.inline_scripts = 0
        self._method = None
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        attributes = {name: value or "" for name, value in attrs}
        self.elements.append((tag, attributes))
        classes = attributes.get("class", "").split()
        if "opblock" in classes:
            self._method = next((c[len("opblock-"):] for c in classes if c.startswith("opblock-")), None)
        if "data-path" in attributes and "opblock-summary-path" in classes and self._method:
            self.operations.append((self._method.upper(), attributes["data-path"]))
        self._in_script = tag == "script" and "src" not in attributes

    def handle_data(self, data):
        if self._in_script and data.strip():
            self.inline_scripts += 1

    def handle_endtag(self, tag):
        self._in_script = False


def parse(text: str) -> _Tags:
    tags = _Tags()
    tags.feed(text)
    return tags


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        message = "headless Chromium is not installed (apt-get install chromium; `make system-deps` installs it)"
        if os.environ.get("QAG_TEST_REQUIRE_SERVICES") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


def test_vendored_swagger_ui_is_the_release_unmodified():
    """The files under swagger_ui/ are the ones SOURCE.txt names, byte for byte, and the page needs no others."""
    listed = dict(line.split()[::-1] for line in (STATIC / "swagger_ui" / "SOURCE.txt").read_text().splitlines()
                  if re.fullmatch(r"[0-9a-f]{64}  \S+", line))
    present = {p.name for p in (STATIC / "swagger_ui").iterdir()} - {"SOURCE.txt"}
    assert present == set(listed), "swagger_ui/ and SOURCE.txt disagree on the files"
    for name, digest in listed.items():
        assert hashlib.sha256((STATIC / "swagger_ui" / name).read_bytes()).hexdigest() == digest, name
    assert {"LICENSE", "NOTICE", "swagger-ui-bundle.js.LICENSE.txt"} <= set(listed)
    served = {relative for relative, _ in docs.FILES.values()}
    assert served <= {f"swagger_ui/{name}" for name in listed} | {"docs.js", "docs.css"}


@pytest.mark.e2e
def test_docs_page_and_assets_come_from_the_server(server):
    page = server.get("/docs", key=None)
    assert page.status == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
    csp = page.headers["content-security-policy"]
    directives = dict((d.strip().split(" ", 1) + [""])[:2] for d in csp.split(";"))
    assert directives["default-src"] == "'none'"
    for name in ("script-src", "style-src", "connect-src"):
        assert directives[name] == "'self'", csp
    assert directives["img-src"] == "'self' data:" and directives["frame-ancestors"] == "'none'"
    assert "unsafe" not in csp and "http" not in csp
    assert page.headers["cache-control"] == "no-store"   # so the asset URLs it names are always the current ones
    tags = parse(page.body.decode())
    # What the CSP would refuse anyway: no inline script, style attribute or event handler on the page itself.
    assert tags.inline_scripts == 0
    assert not [(t, a) for t, a in tags.elements for name in a if name == "style" or name.startswith("on")]
    urls = [a.get("src") or a.get("href") for t, a in tags.elements if t in ("script", "link")]
    assert len(urls) == 5 and all(u.startswith(docs.PREFIX) for u in urls), urls
    for url in urls:
        name = url[len(docs.PREFIX):].split("?")[0]
        relative, content_type = docs.FILES[name]
        r = server.get(url, key=None)
        assert r.status == 200 and r.body == (STATIC / relative).read_bytes(), url
        assert r.headers["content-type"] == content_type and r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["cache-control"] == "public, max-age=31536000, immutable"
        # The URL carries the digest of what it serves, so the year-long cache is never stale.
        assert url.endswith("?v=" + hashlib.sha256(r.body).hexdigest()[:12])
        again = server.request("GET", url, key=None, headers={"If-None-Match": r.headers["etag"]})
        assert again.status == 304 and again.body == b""
    head = server.request("HEAD", "/docs/static/swagger-ui-bundle.js", key=None)
    assert head.status == 200 and head.body == b"" and head.headers["content-type"].startswith("text/javascript")
    # Only the listed files are routes: nothing else of the package is reachable under the prefix.
    assert server.get("/docs/static/LICENSE", key=None).status == 401
    assert server.get("/docs/static/../ops.py").status == 404
    assert server.get("/docs/static/swagger_ui/LICENSE").status == 404


@pytest.mark.e2e
def test_docs_page_renders_offline_in_headless_chromium(server, tmp_path):
    binary = chromium()
    origin = f"http://127.0.0.1:{server.port}"
    # Every host name but the server's address resolves to nothing, so anything the page fetched from another
    # origin would fail and be logged; background and update traffic is off.
    args = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--no-default-browser-check",
            f"--user-data-dir={tmp_path / 'profile'}", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
            "--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000", "--dump-dom", f"{origin}/docs"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    assert done.returncode == 0, done.stderr[-3000:]
    tags = parse(done.stdout)
    # Swagger UI ran: it fetched /openapi.json (an OpenAPI 3.1 document) and listed its operations.
    assert "OAS 3.1" in done.stdout, done.stdout[-2000:]
    # Without a key the document lists the public routes only (issue 22.4); the page reads it again when a key
    # is typed.
    assert {("GET", "/health"), ("GET", "/livez"), ("GET", "/readyz"),
            ("GET", "/openapi.json")} <= set(tags.operations), tags.operations
    assert ("POST", "/execute_sql") not in set(tags.operations)
    # Nothing was refused by the page's CSP, nothing failed to load, and every resource the DOM names is the server's.
    assert not [line for line in console if "Content Security Policy" in line or "Failed to load" in line
                or "ERR_" in line], console
    resources = [a.get("src") or a.get("href") for t, a in tags.elements
                 if t in ("script", "link", "img", "iframe", "source", "object", "embed") and (a.get("src") or
                                                                                             a.get("href"))]
    assert resources and all(u.startswith(("/", origin + "/", "data:")) and not u.startswith("//")
                             for u in resources), resources
