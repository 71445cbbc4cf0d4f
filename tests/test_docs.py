"""The documentation site: ``make docs`` builds it with warnings as errors, every internal
link, anchor and image of the built pages resolves (no network), the pages hold what they
promise (the user guide, the API reference, the examples, the benchmark tables), and headless
Chromium renders them with no console error and no missing resource."""

from __future__ import annotations

import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from browser import Browser, chromium

ROOT = Path(__file__).resolve().parents[1]
REFERENCING = {"a": "href", "link": "href", "img": "src", "script": "src", "iframe": "src", "source": "src"}


class _Page(HTMLParser):
    """The ids a page defines and the references it makes."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids, self.references = set(), []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("id", "name") if tag == "a" else ("id",):
            if attrs.get(key):
                self.ids.add(attrs[key])
        target = attrs.get(REFERENCING.get(tag, ""))
        if target:
            self.references.append(target)


def broken_references(site: Path) -> list[str]:
    """``page: reference`` for every reference in the built ``site`` to a local file that does
    not exist, or to an anchor its page does not define (links with a scheme are not followed)."""
    pages = {}
    for path in site.rglob("*.html"):
        if path.relative_to(site).parts[0] == "_static":  # the theme's templates, not pages
            continue
        page = _Page()
        page.feed(path.read_text(encoding="utf-8"))
        pages[path.resolve()] = page
    broken = []
    for path, page in pages.items():
        for reference in page.references:
            parts = urlsplit(reference)
            if parts.scheme or parts.netloc:
                continue
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{path.relative_to(site)}: {reference} (no such file)")
            elif parts.fragment and target in pages and unquote(parts.fragment) not in pages[target].ids:
                broken.append(f"{path.relative_to(site)}: {reference} (no such anchor)")
    return broken


def test_the_checker_finds_a_missing_page_an_anchor_and_an_image(tmp_path):
    (tmp_path / "a.html").write_text('<h1 id="top">A</h1><a href="b.html#there">b</a><a href="a.html#top">self</a>'
                                     '<a href="#nowhere">x</a><img src="pic.png"><a href="https://example.org/">web</a>')
    (tmp_path / "b.html").write_text('<p id="here">B</p><a href="c.html">c</a>')
    assert sorted(broken_references(tmp_path)) == ["a.html: #nowhere (no such anchor)",
                                                   "a.html: b.html#there (no such anchor)",
                                                   "a.html: pic.png (no such file)", "b.html: c.html (no such file)"]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site as ``make docs`` builds it (warnings are errors), in a directory of its own."""
    pytest.importorskip("sphinx")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(ROOT / "docs"),
                           str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, f"the docs build failed or warned:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return out


def test_the_site_builds_without_warnings_and_every_internal_reference_resolves(site):
    assert broken_references(site) == []


def test_the_site_holds_the_guide_the_api_the_examples_and_the_benchmarks(site):
    guide = sorted(p.stem for p in (site / "guide").glob("*.html"))
    assert {"tour", "mpi", "chains", "solvers", "grids", "gpus", "io", "testing"} <= set(guide)
    assert "Captured steps" in (site / "guide" / "chains.html").read_text(encoding="utf-8")
    api = (site / "api" / "meshchain.html").read_text(encoding="utf-8")
    assert 'id="meshchain.par_loop"' in api and 'id="meshchain.ExtrudedSet"' in api
    examples = (site / "examples.html").read_text(encoding="utf-8")
    assert all(f"{p.name}" in examples for p in (ROOT / "examples").glob("*.py"))
    assert "extruded.py" in (site / "benchmarks.html").read_text(encoding="utf-8")
    assert (site / "_images" / "timeline.png").exists()  # the README's image, on the profiling page


@pytest.fixture(scope="module")
def browser():
    executable = chromium()
    if executable is None:
        pytest.skip("no Chromium on PATH (`make test` installs Debian's chromium package)")
    with Browser(executable) as opened:
        yield opened


def test_the_browser_check_sees_console_errors_exceptions_and_missing_resources(browser, tmp_path):
    page = tmp_path / "bad.html"
    page.write_text('<html><head><link rel="stylesheet" href="missing.css"></head><body><img src="nope.png">'
                    '<script>console.error("boom"); undefinedFunction();</script></body></html>')
    found = "\n".join(browser.problems(page.as_uri()))
    for expected in ("missing.css", "nope.png", "console error: boom", "undefinedFunction is not defined"):
        assert expected in found, found


@pytest.mark.parametrize("page", ["index.html", "api/meshchain.html", "examples.html", "guide/chains.html"])
def test_a_browser_renders_the_pages_with_no_errors_and_no_missing_resources(site, browser, page):
    assert browser.problems((site / page).as_uri()) == []
    if page == "index.html":
        shot = site / "index.png"
        browser.screenshot(shot)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
