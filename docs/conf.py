"""Sphinx configuration of meshchain's documentation site (``make docs``)."""

import sys
from pathlib import Path

import meshchain

sys.path.insert(0, str(Path(__file__).parent))
import render_notebooks  # noqa: E402 - docs/ itself

render_notebooks.write_pages()  # docs/notebooks/*.md from notebooks/*.ipynb, with their outputs

project = "meshchain"
author = "the meshchain developers"
copyright = "2026, the meshchain developers"
release = version = meshchain.__version__

extensions = ["sphinx.ext.autodoc", "numpydoc", "myst_parser"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "gallery"]
myst_heading_anchors = 3
numpydoc_show_class_members = False
autodoc_member_order = "bysource"
html_theme = "pydata_sphinx_theme"
html_title = f"meshchain {release}"
html_context = {"default_mode": "auto"}  # without it the theme logs a console error on a first visit
html_theme_options = {"navigation_with_keys": False}


def _without_module_docstrings(app, what, name, obj, options, lines):
    """The API pages introduce each module themselves; a module docstring's own section titles
    ("Examples") would repeat as labels from page to page."""
    if what == "module":
        lines.clear()


def setup(app):
    app.connect("autodoc-process-docstring", _without_module_docstrings)
