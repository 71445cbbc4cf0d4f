"""The documentation site: ``make docs`` builds it with warnings as errors, every internal
link, anchor and image of the built pages resolves (no network), the pages hold what they
promise (the user guide, the API reference, the examples, the benchmark tables), and headless
Chromium renders them with no console error and no missing resource."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from html import unescape
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


def shown_text(page) -> str:
    """What a page shows as text (tags dropped, entities resolved); ``page``: a path or HTML."""
    html = page.read_text(encoding="utf-8") if isinstance(page, Path) else page
    return unescape(re.sub(r"<[^>]+>", "", html))


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
    guide = {p.stem for p in (site / "guide").glob("*.html")}
    assert guide == {p.stem for p in (ROOT / "docs" / "guide").glob("*.md")}
    assert "Captured steps" in (site / "guide" / "chains.html").read_text(encoding="utf-8")
    api = (site / "api" / "meshchain.html").read_text(encoding="utf-8")
    assert 'id="meshchain.par_loop"' in api and 'id="meshchain.ExtrudedSet"' in api
    examples = shown_text(site / "examples.html")
    for example in (ROOT / "examples").glob("*.py"):  # each with its recorded output
        output = (ROOT / "docs" / "gallery" / f"{example.stem}.txt").read_text().strip().splitlines()
        assert example.name in examples and output[-1].strip() in examples, example.name
    assert "extruded.py" in (site / "benchmarks.html").read_text(encoding="utf-8")
    assert (site / "_images" / "timeline.png").exists()  # the profiling page's image


def test_the_notebooks_are_pages_with_their_outputs_and_figures(site):
    for notebook in (ROOT / "notebooks").glob("*.ipynb"):
        cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
        figures = sum("image/png" in o.get("data", {}) for c in cells for o in c.get("outputs", []))
        page = (site / "notebooks" / f"{notebook.stem}.html").read_text(encoding="utf-8")
        shown = re.findall(r'<img [^>]*src="([^"]+\.png)"', page)
        assert figures > 0 and len(shown) == figures, (notebook.name, figures, shown)
        first_output = next(o for c in cells for o in c.get("outputs", []) if o["output_type"] == "stream")
        assert "".join(first_output["text"]).splitlines()[0] in shown_text(page)


def test_the_gallery_shows_each_examples_output_from_its_current_source():
    """Each example was recorded (``python docs/gallery.py --record NAME``) since its source last
    changed, and the committed page is the one the records give."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gallery", ROOT / "docs" / "gallery.py")
    gallery = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gallery)
    records = gallery.load_records()
    for example in gallery.examples():
        assert example.name in records, f"{example.name} has no recorded output: python docs/gallery.py --record {example.name}"
        assert records[example.name]["sha256"] == gallery.source_hash(example), (
            f"{example.name} changed since its output was recorded: python docs/gallery.py --record {example.name}")
        assert records[example.name]["command"] == " ".join(gallery.command(example.name))
    assert (ROOT / "docs" / "examples.md").read_text() == gallery.page(records), "python docs/gallery.py writes it"


def test_the_readme_is_short_and_links_every_guide_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    for page in (ROOT / "docs" / "guide").glob("*.md"):
        if page.stem != "index":
            assert f"](docs/guide/{page.name})" in readme, f"the README does not link {page.name}"


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


@pytest.mark.parametrize("page", ["index.html", "api/meshchain.html", "examples.html", "guide/chains.html",
                                  "notebooks/chain_profitability.html"])
def test_a_browser_renders_the_pages_with_no_errors_and_no_missing_resources(site, browser, page):
    assert browser.problems((site / page).as_uri()) == []
    if page == "index.html":
        shot = site / "index.png"
        browser.screenshot(shot)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
