"""benchmarks.callgrind_lines: callgrind_annotate's per-C-line counts summed by the source line Cython names."""

from __future__ import annotations

from benchmarks.callgrind_lines import by_line, c_file, report

RUN_C = "/work/build/cython/qag/api/run.c"

# The shape callgrind_annotate prints: a section per annotated file, counted lines with their share, uncounted
# lines as ".", and elided stretches as "-- line N ----" rules.
ANNOTATED = f"""\
--------------------------------------------------------------------------------
-- Auto-annotated source: /work/build/cython/qag/app.c
--------------------------------------------------------------------------------
      .           /* "qag/app.py":126
  9,999 ( 1.00%)      __pyx_t_1 = handle();
-- User-annotated source: {RUN_C}
--------------------------------------------------------------------------------
  1,000 ( 0.10%)  static int module_init(void) {{
      .           /* "qag/api/run.py":550
      .            *         rendered = render(...)
  7,000 ( 0.70%)      __pyx_t_2 = render(a, b);
     50 ( 0.00%)      if (unlikely(!__pyx_t_2)) goto error;
-- line 900 ----------------------------------------
      .           /* "qag/api/run.py":603
  6,000 ( 0.60%)      done(plan);
      .           /* "qag/api/run.py":550
    150 ( 0.00%)      Py_DECREF(__pyx_t_2);
-- line 1200 ----------------------------------------
      .           /* "qag/_speedups/_pgpipe.pyx":12
    400 ( 0.04%)      put();
"""


def test_counts_go_to_the_source_line_of_the_last_marker_above_them_in_that_file_only():
    counts = by_line(ANNOTATED, RUN_C)
    assert counts == {("qag/api/run.py", 550): 7200, ("qag/api/run.py", 603): 6000,
                      ("qag/_speedups/_pgpipe.pyx", 12): 400}
    # Another file's section (app.c) counts for that file, and lines before any marker count for none.
    assert by_line(ANNOTATED, "/work/build/cython/qag/app.c") == {("qag/app.py", 126): 9999}
    assert by_line(ANNOTATED, "/elsewhere/run.c") == {}


def test_a_file_recorded_under_its_path_from_the_checkout_is_found_too():
    # An in-place rebuild compiles from the checkout, and the profile then names the file relative to it.
    relative = ANNOTATED.replace(RUN_C, "build/cython/qag/api/run.c")
    assert by_line(relative, RUN_C, root="/work") == by_line(ANNOTATED, RUN_C, root="/work") != {}


def write_source(root, path: str, lines: dict[int, str]) -> None:
    """A source file under `root` holding `lines` (1-based line number -> text), blank elsewhere."""
    source = root / path
    source.parent.mkdir(parents=True, exist_ok=True)
    text = [""] * max(lines)
    for number, line in lines.items():
        text[number - 1] = line
    source.write_text("\n".join(text) + "\n")


def test_report_divides_by_requests_and_shows_each_lines_source(tmp_path):
    write_source(tmp_path, "qag/api/run.py", {550: "        rendered = render(prepared, values)",
                                              603: "        self.observe.done(plan)"})
    text = report(by_line(ANNOTATED, RUN_C), per=100, top=2, root=str(tmp_path))
    assert text.splitlines() == ["        72  qag/api/run.py:550  rendered = render(prepared, values)",
                                 "        60  qag/api/run.py:603  self.observe.done(plan)"]


def test_definition_lines_where_wrappers_land_are_left_out_unless_asked_for(tmp_path):
    write_source(tmp_path, "qag/api/run.py", {550: "    def render_page(self, plan):",
                                              603: "        self.observe.done(plan)"})
    write_source(tmp_path, "qag/_speedups/_pgpipe.pyx", {12: "    self.put(items)"})
    counts = by_line(ANNOTATED, RUN_C)
    shown = [line.split()[1] for line in report(counts, 1, 5, root=str(tmp_path)).splitlines()]
    assert shown == ["qag/api/run.py:603", "qag/_speedups/_pgpipe.pyx:12"]
    shown = [line.split()[1] for line in report(counts, 1, 5, root=str(tmp_path), with_defs=True).splitlines()]
    assert shown == ["qag/api/run.py:550", "qag/api/run.py:603", "qag/_speedups/_pgpipe.pyx:12"]


def test_a_sources_generated_c_file_is_under_the_build_folder():
    assert c_file("qag/api/run.py").endswith("/build/cython/qag/api/run.c")
    assert c_file("qag/_speedups/_pgpipe.pyx").endswith("/build/cython/qag/_speedups/_pgpipe.c")
