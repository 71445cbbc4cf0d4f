"""Numba's disk cache of meshchain's compiled functions, stamped with what they were built from.

Numba keeps a function's machine code on disk (``cache=True``) under a stamp of the one source
file that defines it. The functions it calls from other files are compiled into that machine
code, and their files are not in the stamp: after one of them changed (a new meshchain
installed over the old one, whose ``__pycache__`` files pip leaves behind; an edit), a process
loads machine code built from the old callees and runs the old code without a word.
Reproduced with two files: a cached function in one calling a function in the other, the
other changed, a new process still gave the old result.

For the functions of meshchain's own modules, and of the loop modules it generates (named
``_meshchain_generated_*``), the stamp here is a hash of the defining file and of every
meshchain module it imports, directly or through others (imports read from the source text,
those inside functions included). A change in any of them makes Numba compile the function
again and overwrite its entry; the machine code stays where Numba would keep it (the user's
``NUMBA_CACHE_DIR``, else ``__pycache__`` beside the file, else Numba's user-wide directory).
The files are named relative to the package, so copies of the same sources (two clones, two
environments) share the generated loops' entries. A function decorated after one of the files
its stamp covers changed on disk (under a running process) was compiled from the old text: it
is kept under a stamp of its own. Other packages' functions keep Numba's own stamp.

Examples
--------
>>> import pathlib, tempfile
>>> root = pathlib.Path(tempfile.mkdtemp()) / "pkg"; root.mkdir()
>>> _ = (root / "__init__.py").write_text("")
>>> _ = (root / "low.py").write_text("def g():\\n    return 1\\n")
>>> _ = (root / "high.py").write_text("from .low import g\\n")
>>> before = source_stamp(root / "high.py", root, "pkg")
>>> _ = (root / "low.py").write_text("def g():\\n    return 2\\n")
>>> source_stamp(root / "high.py", root, "pkg") != before
True
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
import warnings
from pathlib import Path

from .cache import bounded, memo
from .errors import MeshchainWarning

__all__ = ["source_stamp", "sources", "cover", "install"]

GENERATED_PREFIX = "_meshchain_generated_"
"""The module names of the loop modules meshchain generates (their functions are covered)."""

_ROOT = Path(__file__).resolve().parents[1]
_COVERED = {"meshchain": _ROOT}  # package name -> its directory
_FILES = memo("numba cache source files", limit=4096)  # (path, mtime, size, root, package) -> (digest, imported files)
_STAMPS = memo("numba cache stamps", limit=4096)  # (path, root, package) -> the stamp this process gives
_IMPORTED = memo("numba cache files as imported")  # a covered package's file -> (mtime, size) as imported
_IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+([.\w]+)[ \t]+import[ \t]+(\([^)]*\)|[^\n#]*)|import[ \t]+([^\n#]+))",
                     re.MULTILINE)


def cover(name: str, root) -> None:
    """Stamp the functions of package ``name`` (its directory ``root``, before the package is
    imported) as meshchain's own."""
    _COVERED[name] = Path(root).resolve()
    _note_files(_COVERED[name])


def _note_files(root: Path) -> None:
    """Each ``.py`` file of ``root`` with its modification time and size now (as imported)."""
    for folder, folders, files in os.walk(root):
        folders[:] = [name for name in folders if name != "__pycache__"]
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                status = os.stat(path)
                _IMPORTED[path] = (status.st_mtime_ns, status.st_size)


def source_stamp(path, root=_ROOT, package: str = "meshchain") -> str:
    """A hash of the file ``path`` and of every module of ``package`` (in directory ``root``)
    that it imports, directly or through others (:func:`sources`), with their names relative
    to ``root``: two copies of the same sources (clones, virtual environments) sharing a cache
    directory of generated loops give their loops the same stamp."""
    return _hashed(sources(path, root, package), Path(root).resolve())


def _hashed(found: list, root: Path) -> str:
    """The hash of :func:`sources`' ``found``, each file named relative to ``root`` (copies alike share it)."""
    total = hashlib.sha256()
    for file, digest in found:
        name = file.relative_to(root).as_posix() if root in file.parents else file.name
        total.update(name.encode() + b"\0" + digest)
    return total.hexdigest()


def sources(path, root=_ROOT, package: str = "meshchain") -> list:
    """``(file, sha256)`` of ``path`` and of every module of ``package`` it imports, directly
    or through others, in the order found."""
    root, seen, order, found = os.path.realpath(root), set(), [os.path.realpath(path)], []
    while order:
        current = order.pop()
        if current in seen:
            continue
        seen.add(current)
        digest, imported = _read(current, root, package)
        found.append((Path(current), digest))
        order += [module for module in imported if module not in seen]
    return found


def _process_stamp(path, root: Path, package: str) -> str:
    """:func:`source_stamp` of the sources this process imported. Numba asks for it as each
    function is decorated, which may be long after the import (a loop module generated an
    hour in); where one of the package's files it covers changed on disk since (an upgrade
    or an edit under a running process) the machine code compiled here comes from the old
    text, so it gets a stamp of its own that no other process's sources give."""
    key = (str(path), str(root), package)
    found = _STAMPS.get(key)
    if found is None:
        files, changed = sources(path, root, package), False
        for file, _ in files:
            if root in file.parents:
                status = os.stat(file)
                changed = changed or _IMPORTED.get(str(file)) != (status.st_mtime_ns, status.st_size)
        bounded("numba cache stamps")
        found = _STAMPS[key] = f"changed since imported {uuid.uuid4()}" if changed else _hashed(files, root)
    return found


def _read(path: str, root: str, package: str) -> tuple:
    """``(sha256 of the file, the files of the modules of package it imports)``, kept while
    the file's modification time and size stay."""
    status = os.stat(path)
    key = (path, status.st_mtime_ns, status.st_size, root, package)
    found = _FILES.get(key)
    if found is None:
        with open(path, "rb") as source:
            text = source.read()
        here = _package_of(path, root, package)
        files = {_module_file(name, here, root, package) for name in _imported_names(text.decode("utf-8", "replace"))}
        files.discard(None)
        bounded("numba cache source files")
        found = _FILES[key] = (hashlib.sha256(text).digest(), tuple(sorted(files)))
    return found


def _imported_names(text: str) -> list:
    """The modules, and the names imported from them (possibly modules too), of every import
    statement in ``text`` (those inside functions included)."""
    names = []
    for base, listed, plain in _IMPORT.findall(text.replace("\\\n", " ")):  # continued lines joined
        if plain:
            names += [part.split()[0] for part in plain.split(",") if part.strip()]
        else:
            listed = re.sub(r"#[^\n]*", "", listed.strip("()"))  # comments between the names
            parts = [part.split()[0] for part in listed.replace("\n", " ").split(",") if part.strip()]
            names += [base] + [f"{base}.{part}" if base.strip(".") else base + part for part in parts]
    return names


def _package_of(path: str, root: str, package: str) -> str | None:
    """The package a file of ``root`` lies in (None: outside it, such as a generated module)."""
    folder = os.path.dirname(path)
    if folder == root:
        return package
    if not folder.startswith(root + os.sep):
        return None
    return ".".join((package, *os.path.relpath(folder, root).split(os.sep)))


def _module_file(name: str, here: str | None, root: str, package: str) -> str | None:
    """The file of module ``name`` (relative to package ``here`` when it starts with dots) if
    it is one of ``package``'s, else None."""
    if name.startswith("."):
        if here is None:
            return None
        level, rest = len(name) - len(name.lstrip(".")), name.lstrip(".")
        parts = here.split(".")
        if level > len(parts):
            return None
        name = ".".join(parts[:len(parts) - level + 1] + ([rest] if rest else []))
    parts = name.split(".")
    if parts[0] != package:
        return None
    base = os.path.join(root, *parts[1:])
    for candidate in (os.path.join(base, "__init__.py"),) + ((base + ".py",) if len(parts) > 1 else ()):
        if os.path.isfile(candidate):
            return candidate
    return None


def _covering(py_func, py_file: str):
    """``(root, package)`` whose stamp covers ``py_func`` (defined in ``py_file``), or None."""
    if getattr(py_func, "__module__", "").startswith(GENERATED_PREFIX):
        return _ROOT, "meshchain"
    path = Path(py_file).resolve()
    for package, root in _COVERED.items():
        if root == path.parent or root in path.parents:
            return root, package
    return None


def _locator_class():
    """Numba's cache locator for the covered functions (made when first asked: it imports Numba)."""
    from numba.core import caching, config

    class DependencyStampLocator(caching._CacheLocator):
        """Where Numba would keep the machine code, under :func:`source_stamp`."""

        def __init__(self, py_func, py_file, covering, path):
            self._py_file, self._lineno, self._covering = py_file, py_func.__code__.co_firstlineno, covering
            self._cache_path = path

        def get_cache_path(self):
            return self._cache_path

        def get_source_stamp(self):
            return _process_stamp(self._py_file, *self._covering)

        def get_disambiguator(self):
            return str(self._lineno)

        @classmethod
        def from_function(cls, py_func, py_file):
            covering = _covering(py_func, py_file) if os.path.exists(py_file) else None
            if covering is None:
                return None
            for path in _candidate_paths(cls, config, py_file):
                self = cls(py_func, py_file, covering, path)
                try:
                    self.ensure_cache_path()
                except OSError:
                    continue
                return self
            return None

    return DependencyStampLocator


def _candidate_paths(cls, config, py_file: str) -> list:
    """Numba's own places, in its order: ``NUMBA_CACHE_DIR``, ``__pycache__``, user-wide."""
    from numba.misc.appdirs import AppDirs

    subpath = cls.get_suitable_cache_subpath(py_file)
    found = [os.path.join(config.CACHE_DIR, subpath)] if config.CACHE_DIR else []
    found.append(os.path.join(os.path.dirname(py_file), "__pycache__"))
    found.append(os.path.join(AppDirs(appname="numba", appauthor=False).user_cache_dir, subpath))
    return found


def install() -> None:
    """Put the locator first in Numba's list (once; before any covered function is decorated).
    Where this Numba has no such list, say that cached machine code may be stale."""
    try:
        from numba.core import caching

        implementation = getattr(caching, "CacheImpl", None) or caching._CacheImpl  # (its older name)
        classes = implementation._locator_classes
        if not any(getattr(c, "__name__", "") == "DependencyStampLocator" for c in classes):
            classes.insert(0, _locator_class())
            _note_files(_ROOT)
        from numba.core import config

        if getattr(config, "CACHE_LOCATOR_CLASSES", None):
            warnings.warn(MeshchainWarning(
                f"NUMBA_CACHE_LOCATOR_CLASSES is set ({config.CACHE_LOCATOR_CLASSES}): Numba uses those locators "
                f"alone, so meshchain's compiled functions are cached under the stamp of their own file only; "
                f"after meshchain changes, remove its cached machine code (*.nbi, *.nbc) by hand."), stacklevel=2)
    except (ImportError, AttributeError) as exc:
        warnings.warn(MeshchainWarning(
            f"meshchain could not stamp Numba's disk cache with the files each function was built from ({exc}); "
            f"after meshchain changes, remove the __pycache__ folders under {_ROOT} (Numba's *.nbi and *.nbc files) "
            f"so that no stale machine code is loaded."), stacklevel=2)
