"""Numba's disk cache of meshchain's compiled functions is stamped with every meshchain module
they import, so that machine code built from old callees is never loaded
(:mod:`meshchain.core.numba_cache`)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types

import pytest

import meshchain as mc
from meshchain.core import numba_cache

SCRIPT = """
import sys
sys.path.insert(0, {root!r})
import meshchain.core.numba_cache as stamps
if {cover}:
    stamps.cover("pkg", {package!r})
import pkg.high
value = pkg.high.f()
print(value, sum(pkg.high.f.stats.cache_hits.values()), sum(pkg.high.f.stats.cache_misses.values()))
"""


def _package(root, value: int) -> None:
    """``pkg.high.f``, cached, returns ``pkg.low.g()``; ``pkg.low`` (another file) returns ``value``."""
    package = root / "pkg"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text(f"import numba\n\n\n@numba.njit\ndef g():\n    return {value}\n")
    (package / "high.py").write_text(textwrap.dedent("""\
        import numba

        from .low import g


        @numba.njit(cache=True)
        def f():
            return g()
        """))


def _run(root, *, cover: bool) -> tuple:
    """``(f's value, cache hits, cache misses)`` in a new process."""
    env = {key: value for key, value in os.environ.items() if key != "NUMBA_CACHE_DIR"}
    script = SCRIPT.format(root=str(root), cover=cover, package=str(root / "pkg"))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return tuple(int(word) for word in done.stdout.split()[-3:])


@pytest.mark.parametrize("cover", [True, False])
def test_a_cached_function_is_compiled_again_when_a_module_it_imports_changed(tmp_path, cover):
    """A function kept on disk calls one from another file: with the stamp of the modules it
    imports, a new process loads the kept machine code while nothing changed and compiles it
    again once the other file changed; with Numba's stamp alone (the file that defines it) the
    new process runs the old callee, the fault this module removes."""
    _package(tmp_path, 1)
    assert _run(tmp_path, cover=cover) == (1, 0, 1)  # compiled and kept
    assert _run(tmp_path, cover=cover) == (1, 1, 0)  # loaded from the disk cache
    _package(tmp_path, 2)
    if cover:
        assert _run(tmp_path, cover=cover) == (2, 0, 1)
        assert _run(tmp_path, cover=cover) == (2, 1, 0)
    else:
        assert _run(tmp_path, cover=cover) == (1, 1, 0)  # stale: what a meshchain upgrade met before


def test_meshchain_functions_are_stamped_with_the_modules_they_import():
    """Meshchain's cached functions use the stamp; a solver's module's stamp covers the
    kernels and the MPI calls it compiles in; a generated loop module's functions are
    covered wherever the cache directory lies; other packages' are not."""
    from meshchain.linalg import blockcg

    locator = blockcg.block_sums._cache._impl.locator
    assert type(locator).__name__ == "DependencyStampLocator"
    assert locator.get_source_stamp() == numba_cache.source_stamp(blockcg.__file__)
    covered = {path.relative_to(numba_cache._ROOT).as_posix() for path, _ in numba_cache.sources(blockcg.__file__)}
    assert {"linalg/blockcg.py", "backends/sparse.py", "comm/by_address.py", "linalg/sstep.py"} <= covered
    assert "linalg/cagmres.py" not in covered and "apps/poisson.py" not in covered  # not imported by it
    generated = types.SimpleNamespace(__module__=numba_cache.GENERATED_PREFIX + "loop_abc")
    assert numba_cache._covering(generated, "/elsewhere/cache/numba/loop_abc.py") == (numba_cache._ROOT, "meshchain")
    assert numba_cache._covering(types.SimpleNamespace(__module__="theirs"), "/elsewhere/theirs.py") is None


def test_imports_are_read_in_every_form(tmp_path):
    """Relative and absolute imports, several names per line, parenthesised lists over
    several lines (with comments), lines continued with a backslash and imports inside
    functions all count; other packages' do not."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    for name in ("__init__.py", "a.py", "b.py", "c.py", "d.py", "e.py", "sub/__init__.py", "sub/f.py", "sub/g.py",
                 "sub/h.py"):
        (package / name).write_text("")
    (package / "sub" / "f.py").write_text(textwrap.dedent("""\
        import numpy as np, pkg.a
        from .. import b
        from ..c import (
            name,  # why
            other,
        )
        from pkg import d as renamed, \
            sub as package
        from . import (g,  # first
                       h)


        def late():
            from ..e import thing
        """))
    found = {path.relative_to(package).as_posix() for path, _ in numba_cache.sources(package / "sub" / "f.py",
                                                                                     package, "pkg")}
    assert found == {"sub/f.py", "a.py", "b.py", "c.py", "d.py", "e.py", "__init__.py", "sub/__init__.py", "sub/g.py",
                     "sub/h.py"}


def test_copies_of_the_same_sources_share_a_stamp(tmp_path):
    """Two copies of a package (two clones, two environments) sharing a cache directory of
    generated loops give the same stamp, so they do not compile each other's loops again;
    a copy with one imported module changed does not."""
    for copy in ("one", "two"):
        _package(tmp_path / copy, 1)
    stamps = [numba_cache.source_stamp(tmp_path / copy / "pkg" / "high.py", tmp_path / copy / "pkg", "pkg")
              for copy in ("one", "two")]
    assert stamps[0] == stamps[1]
    _package(tmp_path / "two", 2)
    assert numba_cache.source_stamp(tmp_path / "two" / "pkg" / "high.py", tmp_path / "two" / "pkg", "pkg") != stamps[0]


LATE = """
import sys, pathlib
sys.path.insert(0, {root!r})
import meshchain.core.numba_cache as stamps
stamps.cover("pkg", {package!r})
import pkg.low
if {edit}:  # the file changes under this process, which keeps the old g
    pathlib.Path({package!r}, "low.py").write_text("import numba\\n\\n\\n@numba.njit\\ndef g():\\n    return 2\\n")
import pkg.late
print(pkg.late.h(), pkg.late.h._cache._impl.locator.get_source_stamp().startswith("changed since imported"))
"""


def test_a_function_decorated_after_a_module_it_imports_changed_on_disk_is_not_kept_for_the_new_text(tmp_path):
    """A cached function decorated late (a loop module generated an hour in) after a module it
    imports changed on disk: this process compiled it with the old callee, so it is kept under a
    stamp of its own, and the next process, importing the new text, compiles it again instead
    of loading the old callee's machine code."""
    _package(tmp_path, 1)
    (tmp_path / "pkg" / "late.py").write_text("import numba\n\nfrom .low import g\n\n\n@numba.njit(cache=True)\n"
                                              "def h():\n    return g()\n")
    env = {key: value for key, value in os.environ.items() if key != "NUMBA_CACHE_DIR"}

    def run(edit: bool) -> list:
        script = LATE.format(root=str(tmp_path), package=str(tmp_path / "pkg"), edit=edit)
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()[-2:]

    assert run(True) == ["1", "True"]  # the old g, compiled in: a stamp no process will find again
    assert run(False) == ["2", "False"]  # the new text: compiled again, not the old callee's code loaded


def test_a_locator_list_of_the_users_own_is_reported(monkeypatch):
    """With ``NUMBA_CACHE_LOCATOR_CLASSES`` set Numba uses those locators alone: meshchain says
    its stamps are not used, and how to clear what may be stale."""
    from numba.core import config

    monkeypatch.setattr(config, "CACHE_LOCATOR_CLASSES", "InTreeCacheLocator", raising=False)
    with pytest.warns(mc.MeshchainWarning, match="NUMBA_CACHE_LOCATOR_CLASSES is set"):
        numba_cache.install()
