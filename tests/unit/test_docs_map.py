"""The documentation's maps stay true to the tree (issue 25.3).

- docs/architecture.md's code map names every module under qag/ (and every .pyx twin) under its package's line,
  and marks [c] exactly the compiled ones: those of the one list, qag/_speedups/compiled.py;
- docs/architecture.md stays a page a newcomer reads in ten minutes (at most MAX_LINES lines, none very long);
- every contract section ("contract 3.10", "contract's 7.1", "contract 6.6, 6.7") and behaviour ("B6.5") cited in
  the code, the tests (their data files too), the benchmarks or the docs resolves in docs/contract-index.md;
- every docs/*.md a document links to or names exists, and a link's #anchor names a heading of its target.

Reads files only (compiled.py is loaded by its path, as the build loads it): no qag import, no service.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "qag")
ARCHITECTURE = os.path.join(ROOT, "docs", "architecture.md")
INDEX = os.path.join(ROOT, "docs", "contract-index.md")
MAX_LINES = 150
MAX_WIDTH = 160
COMPILED_MARK = "[c]"
# Where the list of request-path modules compiled from their own .py may live (the first that has one wins).
CITING_DIRS = ("qag", "tests", "benchmarks", "build_backend", "docs")
CITING_SUFFIXES = (".py", ".pyx", ".lua", ".tsv", ".md")


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def _modules() -> set[str]:
    """Every module file under qag/: 'qag/app.py', 'qag/_speedups/_rowjson.pyx', ..."""
    found = set()
    for directory, dirs, files in os.walk(PACKAGE):
        dirs[:] = [d for d in dirs if d != "__pycache__" and not d.startswith(".")]
        for name in files:
            if name.endswith((".py", ".pyx")):
                found.add(os.path.relpath(os.path.join(directory, name), ROOT).replace(os.sep, "/"))
    return found


def _module_path(text: str) -> str | None:
    """'qag/app.py', 'qag.api.run' or a path relative to qag/ ('api/run.py') as a module file path, else None."""
    if re.fullmatch(r"qag(/\w+)+\.pyx?", text):
        return text
    if re.fullmatch(r"qag(\.\w+)+", text):
        return text.replace(".", "/") + ".py"
    if re.fullmatch(r"\w+(/\w+)*\.py", text):
        return "qag/" + text
    return None


def _load_compiled_list() -> tuple:
    path = os.path.join(ROOT, "qag", "_speedups", "compiled.py")
    spec = importlib.util.spec_from_file_location("qag_compiled_list", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.COMPILED


COMPILED = _load_compiled_list()


def _compiled() -> set[str]:
    """Every compiled module, from the one list (qag/_speedups/compiled.py)."""
    missing = sorted(p for p in COMPILED if not os.path.exists(os.path.join(ROOT, p)))
    assert not missing, f"qag/_speedups/compiled.py lists modules that don't exist: {missing}"
    return set(COMPILED)


def _code_map() -> tuple[dict[str, bool], list[str]]:
    """({module path: marked compiled} as docs/architecture.md's '## Code map' section names them, problems).

    A package line is a line starting with **`qag/<package>/`**; every `name.py` / `name.pyx` after it, up to the
    next package line, is a module of that package, marked compiled when " [c]" follows it (`a.py`, `b.py` [c]:
    only b is marked)."""
    text = _read(ARCHITECTURE)
    section = re.search(r"^## Code map\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert section, "docs/architecture.md has no '## Code map' section"
    named: dict[str, bool] = {}
    problems = []
    package = None
    for line in section.group(1).splitlines():
        head = re.match(r"\*\*`(qag/(?:\w+/)*)`\*\*", line)
        if head:
            package = head.group(1)
        for match in re.finditer(r"`([\w./]+\.pyx?)`( \[c\])?", line):
            name, marked = match.group(1), bool(match.group(2))
            if name.startswith("qag/"):
                path = name
            elif package is None:
                problems.append(f"{name!r} comes before any package line")
                continue
            else:
                path = package + name
            named[path] = named.get(path, False) or marked
    return named, problems


def test_code_map_names_every_module_under_its_package():
    named, problems = _code_map()
    assert not problems, problems
    missing = sorted(_modules() - set(named))
    assert not missing, (f"docs/architecture.md's code map does not name {missing}: add a line for each under its "
                         f"package's **`qag/.../`** line (one or two lines per module)")
    gone = sorted(p for p in named if not os.path.exists(os.path.join(ROOT, p)))
    assert not gone, f"docs/architecture.md's code map names modules that no longer exist: {gone}"


def test_code_map_marks_exactly_the_compiled_modules():
    named, _ = _code_map()
    compiled = _compiled()
    unmarked = sorted(p for p in compiled if not named.get(p))
    assert not unmarked, (f"compiled modules not marked {COMPILED_MARK} in docs/architecture.md's code map (or not "
                          f"named there): {unmarked}")
    stale = sorted(p for p, marked in named.items() if marked and p not in compiled)
    assert not stale, f"marked {COMPILED_MARK} in docs/architecture.md but not compiled: {stale}"


def test_compiled_list_names_the_request_path_and_the_twins():
    assert {"qag/app.py", "qag/api/run.py"} <= set(COMPILED)
    assert {m for m in _modules() if m.endswith(".pyx")} <= set(COMPILED)


def test_architecture_stays_short():
    lines = _read(ARCHITECTURE).splitlines()
    assert len(lines) <= MAX_LINES, (f"docs/architecture.md has {len(lines)} lines (at most {MAX_LINES}): move "
                                     f"depth to the page it belongs to (security.md, host-state.md, ...) and link it")
    wide = [(n, len(line)) for n, line in enumerate(lines, 1) if len(line) > MAX_WIDTH]
    assert not wide, f"docs/architecture.md lines over {MAX_WIDTH} characters (line, length): {wide}"


# --- contract numbers ------------------------------------------------------------------------------------------
_NUMBER = r"\d{1,2}(?:\.\d{1,2}){0,2}"
_CITE = re.compile(r"\bcontract(?:'s)?(?:\s+sections?)?\s+(" + _NUMBER + r"(?:(?:\s*(?:,|/|-|–|and)\s*)"
                   + _NUMBER + r")*)(?![\d.]*\d|,\d)", re.I)
_BEHAVIOUR = re.compile(r"\bB(\d{1,2})\.(\d{1,2})\b(?:\s*[-–]\s*B?(\d{1,2})\.(\d{1,2})\b)?")


def _expand(first: str, last: str) -> list[str]:
    """'3.6', '3.8' -> 3.6, 3.7, 3.8 (a range within one section); else the two ends."""
    a, b = first.split("."), last.split(".")
    if len(a) == len(b) == 2 and a[0] == b[0] and int(a[1]) <= int(b[1]):
        return [f"{a[0]}.{n}" for n in range(int(a[1]), int(b[1]) + 1)]
    return [first, last]


def cited_numbers(text: str) -> set[str]:
    """Contract sections ('3.10') and behaviours ('B6.5') cited in `text`."""
    found = set()
    for match in _CITE.finditer(text):
        parts = re.split(r"\s*(,|/|-|–|and)\s*", match.group(1))
        numbers, seps = parts[0::2], parts[1::2]
        found.update(numbers)
        for i, sep in enumerate(seps):
            if sep in ("-", "–"):
                found.update(_expand(numbers[i], numbers[i + 1]))
    for match in _BEHAVIOUR.finditer(text):
        major, minor, major2, minor2 = match.groups()
        found.add(f"B{major}.{minor}")
        if major2 is not None and major2 == major:
            found.update(f"B{major}.{n}" for n in range(int(minor), int(minor2) + 1))
    return found


def _citations() -> dict[str, list[str]]:
    """{number: [files citing it]} over the code, the tests, the benchmarks and the docs (the index aside)."""
    out: dict[str, list[str]] = {}
    for top in CITING_DIRS:
        for directory, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [d for d in dirs if d not in ("__pycache__", "static", "results") and not d.startswith(".")]
            for name in files:
                if not name.endswith(CITING_SUFFIXES):
                    continue
                path = os.path.join(directory, name)
                if path == INDEX:
                    continue
                try:
                    text = _read(path)
                except UnicodeDecodeError:
                    continue
                for number in cited_numbers(text):
                    out.setdefault(number, []).append(os.path.relpath(path, ROOT))
    return out


def indexed_numbers() -> set[str]:
    """The numbers docs/contract-index.md resolves: every **N.N ...** and **BN.N** entry."""
    return set(re.findall(r"\*\*(B?\d{1,2}(?:\.\d{1,2}){0,2})\b", _read(INDEX)))


@pytest.mark.parametrize("text,expected", [
    ("the contract's order (contract 3.10)", {"3.10"}),
    ("contract 6.6, 6.7, 7.4: shared", {"6.6", "6.7", "7.4"}),
    ("(contract 3.1, 3.6-3.8, 10.5)", {"3.1", "3.6", "3.7", "3.8", "10.5"}),
    ("contract 0.4–0.6", {"0.4", "0.5", "0.6"}),
    ("Contract section 7.1/7.2 (the response cache)", {"7.1", "7.2"}),
    ("the contract's 10,000 (a counter)", set()),
    ("the contract's 403 for a precomputed Access", set()),
    ("contract 6.7's effective_limits", {"6.7"}),
    ("B6.6-B6.11 against real SQLite", {f"B6.{n}" for n in range(6, 12)}),
    ("every behaviour B7.1 - B7.8", {f"B7.{n}" for n in range(1, 9)}),
    ("(contract 10.2, 10.4, 10.5, B10.7, B10.8)", {"10.2", "10.4", "10.5", "B10.7", "B10.8"}),
])
def test_citations_are_read(text, expected):
    assert cited_numbers(text) == expected


def test_every_cited_contract_number_is_in_the_index():
    citations = _citations()
    assert "3.10" in citations and "6.2" in citations, "the citation scan found nothing: is the pattern broken?"
    missing = {n: sorted(files)[:3] for n, files in citations.items() if n not in indexed_numbers()}
    assert not missing, (f"contract numbers cited but not in docs/contract-index.md (add the section's title, a "
                         f"summary in qag's words and the module): {dict(sorted(missing.items()))}")


# --- links between documents -----------------------------------------------------------------------------------
def _documents() -> list[str]:
    docs = os.path.join(ROOT, "docs")
    return [os.path.join(ROOT, "README.md")] + sorted(
        os.path.join(docs, name) for name in os.listdir(docs) if name.endswith(".md"))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: str) -> set[str]:
    anchors, seen = set(), {}
    in_code = False
    for line in _read(path).splitlines():
        if line.startswith("```"):
            in_code = not in_code
        match = None if in_code else re.match(r"#{1,6} (.*)", line)
        if match:
            slug = _slug(match.group(1))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def test_links_between_documents_resolve():
    broken = []
    for doc in _documents():
        text = _read(doc)
        base = os.path.dirname(doc)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue   # http:, https:, mailto:
            path, _, anchor = target.partition("#")
            full = os.path.normpath(os.path.join(base, path)) if path else doc
            if not os.path.exists(full):
                broken.append(f"{os.path.relpath(doc, ROOT)} -> {target}: no such file")
            elif anchor and full.endswith(".md") and anchor not in _anchors(full):
                broken.append(f"{os.path.relpath(doc, ROOT)} -> {target}: no such heading")
    assert not broken, broken


def test_docs_named_in_text_exist():
    """`docs/<name>.md` written out in a document or in the code names a file that exists."""
    sources = _documents()
    for top in ("qag",):
        for directory, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [d for d in dirs if d not in ("__pycache__", "static")]
            sources += [os.path.join(directory, n) for n in files if n.endswith((".py", ".pyx"))]
    missing = set()
    for source in sources:
        for name in re.findall(r"(?<![\w/.])docs/([\w.-]+\.md)\b", _read(source)):
            if not os.path.exists(os.path.join(ROOT, "docs", name)):
                missing.add(f"{os.path.relpath(source, ROOT)}: docs/{name}")
    assert not missing, sorted(missing)
