"""The repository's notebooks as pages of the site, with the outputs they were committed with.

``docs/conf.py`` calls :func:`write_pages` when a build starts: each ``notebooks/<name>.ipynb``
becomes ``docs/notebooks/<name>.md`` (markdown cells as they are, code cells as Python blocks,
text outputs as text blocks, PNG figures as images beside the page). The pages are generated,
never edited (``docs/notebooks/`` is ignored by git); nothing is executed.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ROOT / "notebooks"
PAGES = ROOT / "docs" / "notebooks"


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else value


def _math_as_source(markdown: str) -> str:
    """LaTeX stays readable as its source: the site loads no MathJax (it would come from a CDN,
    and the site must work offline), so ``$$...$$`` becomes a text block and ``$...$`` code."""
    markdown = re.sub(r"\$\$(.+?)\$\$", lambda m: "\n```text\n" + m.group(1).strip() + "\n```\n", markdown, flags=re.S)
    return re.sub(r"(?<![\\$])\$([^$\n]+?)\$", lambda m: "`" + m.group(1) + "`", markdown)


def _fenced(language: str, text: str) -> list[str]:
    fence = "````" if "```" in text else "```"
    return [f"{fence}{language}", text.rstrip("\n"), fence, ""]


def _outputs(cell: dict, stem: str, figures: list) -> list[str]:
    lines = []
    for output in cell.get("outputs", []):
        data = output.get("data", {})
        if output["output_type"] == "stream":
            lines += _fenced("text", _text(output["text"]))
        elif "image/png" in data:
            figure = f"{stem}_{len(figures) + 1}.png"
            figures.append((figure, base64.b64decode(_text(data["image/png"]))))
            alt = _text(data.get("text/plain", "a figure")).strip().replace("\n", " ")
            lines += [f"![{alt}]({figure})", ""]
        elif "text/plain" in data:
            lines += _fenced("text", _text(data["text/plain"]))
        elif output["output_type"] == "error":
            lines += _fenced("text", "\n".join(output.get("traceback", [])))
    return lines


def page(notebook: Path) -> tuple[str, list]:
    """The markdown page of ``notebook`` and its figures ``[(file name, PNG bytes)]``."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    lines, figures = [], []
    for cell in cells:
        source = _text(cell["source"])
        if cell["cell_type"] == "markdown":
            lines += [_math_as_source(source).rstrip("\n"), ""]
        elif cell["cell_type"] == "code":
            lines += _fenced("python", source)
            lines += _outputs(cell, notebook.stem, figures)
    note = (f"*This page is `notebooks/{notebook.name}` of the repository, shown with the outputs it was committed "
            "with; open the notebook in Jupyter to run it.*")
    text = "\n".join(lines) + "\n"
    title_end = text.index("\n", text.index("# ")) + 1
    return text[:title_end] + "\n" + note + "\n" + text[title_end:], figures


def write_pages() -> list[str]:
    """Write every notebook's page and figures into ``docs/notebooks``; their page names."""
    shutil.rmtree(PAGES, ignore_errors=True)
    PAGES.mkdir(parents=True)
    names = []
    for notebook in sorted(SOURCES.glob("*.ipynb")):
        text, figures = page(notebook)
        (PAGES / f"{notebook.stem}.md").write_text(text, encoding="utf-8")
        for name, png in figures:
            (PAGES / name).write_bytes(png)
        names.append(notebook.stem)
    return names
