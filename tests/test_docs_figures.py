"""The README's figures (and those of the pages its text moved to) come from docs/benchmarks.md,
whose every row says in one line when, where and which run measured it (the page of current
figures; the run-by-run history is benchmarks-history.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
NUMBER = r"~?\d+(?:\.\d+)?"
# A figure: a number with its unit ("1.239x", "~19 min 5 s", "1400-1514 s", "58 GiB", "4%").
FIGURE = re.compile(rf"(?<![\w.]){NUMBER} min \d+ s\b|(?<![\w.]){NUMBER}(?:-{NUMBER})? ?(?:x|×|%|s|ms|min|GiB|GB|MiB|MB|KiB|TFLOP/s)(?!\w)")
# Numbers with a unit that the README uses as settings or examples, not as results.
NOT_MEASURED = {
    "1 MiB",  # `extforge explain` reads the last 1 MiB of a log
    "~3 min 17 s",  # a line `extforge build` prints, shown as an example
    "4.4 GiB", "3.4 GiB",  # the planner's per-job estimate for a recipe it has no costs for (a setting)
}


def figures(text: str) -> set[str]:
    return {m.group(0).replace("×", "x") for m in FIGURE.finditer(" ".join(text.split()))}


# The README and the pages that carry what it used to say in full.
QUOTING = ["README.md", "docs/recipes.md", "docs/development.md", "docs/commands.md"]


@pytest.mark.parametrize("doc", QUOTING)
def test_the_docs_quote_only_figures_the_benchmarks_page_holds(doc: str):
    quoted = figures((REPO / doc).read_text())
    page = figures((DOCS / "benchmarks.md").read_text())
    assert quoted or doc == "docs/commands.md", f"no figure found in {doc}: the pattern is broken"
    missing = sorted(quoted - page - NOT_MEASURED)
    assert not missing, f"{doc} quotes figures docs/benchmarks.md does not hold (update it from the page): {missing}"


def test_the_readme_is_a_path_and_the_page_one_line_per_figure():
    """The README says what extforge is and where to go (it was 411 lines: set-up timings and
    every recipe's story); the benchmarks page keeps each figure to a row of at most 300
    characters (38 of its 100 rows were longer, the longest 1,877), the rest in its history."""
    assert len((REPO / "README.md").read_text().splitlines()) <= 160
    long = [line[:80] for line in (DOCS / "benchmarks.md").read_text().splitlines()
            if line.startswith("|") and len(line) > 300]
    assert not long, f"rows over 300 characters (move the prose to benchmarks-history.md): {long}"


def test_the_reliability_page_is_one_line_per_case():
    """docs/reliability.md keeps each case to a row of at most 300 characters with its test and,
    for a cut row, a link to the row in full (80 of its 91 rows were longer, the longest 1,219)."""
    page = (DOCS / "reliability.md").read_text()
    long = [line[:80] for line in page.splitlines() if line.startswith("|") and len(line) > 300]
    assert not long, f"rows over 300 characters (move the full row to reliability-history.md): {long}"
    references = dict(re.findall(r"^\[([^\]]+)\]: (\S+)$", page, re.M))
    for ref in re.findall(r"\]\[([^\]]+)\]", page):
        assert ref in references, f"[{ref}] is not defined at the page's end"
    for link in references.values():
        target, _, anchor = link.partition("#")
        assert anchor in _anchors((DOCS / target).read_text()), link
    # The benchmarks' history is linked from benchmarks.md alone; the reliability rows have their own page.
    assert all(not link.startswith("benchmarks-history.md") for link in references.values())


def test_figures_are_found_as_the_readme_writes_them():
    assert figures("~19 min 5 s on 32 cores, 1.239x SDPA, 1400-1514 s, under 1 s, 58 GiB, within 4%") == {
        "~19 min 5 s", "1.239x", "1400-1514 s", "1 s", "58 GiB", "4%"}
    # Not figures: versions, archs, build strings, a number inside a word.
    assert figures("python 3.12, sm_90, cuda130_torch211, b4 s4096 h16 d128, x86_64, 0.51 s") == {"0.51 s"}


def _anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a file's headings (a repeated heading gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for line in markdown.splitlines():
        if m := re.match(r"^#+ (.*)", line):
            anchor = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            n = seen.get(anchor, 0)
            seen[anchor] = n + 1
            out.add(anchor if n == 0 else f"{anchor}-{n}")
    return out


def test_every_current_figure_has_its_date_machine_and_run():
    page = (DOCS / "benchmarks.md").read_text()
    # Reference-style links ([history][name], `[name]: target` at the end) keep a row to one line.
    references = dict(re.findall(r"^\[([^\]]+)\]: (\S+)$", page, re.M))
    rows, in_table = [], False
    for line in page.splitlines():
        # The tables of figures; the page's other tables (a profile) explain one of their rows.
        in_table = line.startswith("| figure | value | date | machine | run |") or (in_table and line.startswith("|"))
        if in_table and not line.startswith(("| figure |", "|---")):
            rows.append(line)
    assert len(rows) > 20
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 5, row
        figure, value, date, machine, run = cells
        assert figure and value and machine, row
        assert re.fullmatch(r"2\d{3}-\d\d-\d\d", date), row
        links = re.findall(r"\]\(([^)]+)\)", run)
        for ref in re.findall(r"\]\[([^\]]+)\]", run):
            assert ref in references, (row, f"[{ref}] is not defined at the page's end")
            links.append(references[ref])
        assert links or re.search(r"\bcommits? [0-9a-f]{7}", run) or "issue" in run, row
        for link in links:
            target, _, anchor = link.partition("#")
            path = (DOCS / (target or "benchmarks.md")).resolve()
            assert path.is_file(), (row, link)
            if anchor:
                assert anchor in _anchors(path.read_text()), (row, link)
