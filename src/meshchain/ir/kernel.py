"""Kernels: a Python function plus its parsed source, shared by every backend.

A kernel receives one small array view per loop argument. The globals it reads
(module constants, small constant arrays, math modules, helper functions) are
resolved when a loop is compiled and become compile-time constants, as in Numba:
changing a module constant later makes meshchain compile a new version.

Examples
--------
>>> import meshchain as mc
>>> @mc.kernel
... def double(a, b):
...     b[0] = 2.0 * a[0]
>>> double.name, double.params
('double', ('a', 'b'))
"""

from __future__ import annotations

import ast
import builtins
import inspect
import textwrap
import types
from dataclasses import dataclass

import numpy as np

from .analysis import index_safety, integer_constants, non_increment_uses, written_params
from ..core.cache import memo
from ..core.errors import KernelError

__all__ = ["Kernel", "kernel", "Constant"]

ALLOWED_BUILTINS = frozenset({"range", "min", "max", "abs", "float", "int", "bool", "len", "round", "print", "pow"})
_FORBIDDEN = {
    ast.FunctionDef: "a nested function definition",
    ast.AsyncFunctionDef: "a nested function definition",
    ast.Lambda: "a lambda",
    ast.ClassDef: "a class definition",
    ast.Global: "a 'global' statement",
    ast.Nonlocal: "a 'nonlocal' statement",
    ast.Import: "an import",
    ast.ImportFrom: "an import",
    ast.Yield: "'yield'",
    ast.YieldFrom: "'yield from'",
    ast.Await: "'await'",
    ast.Try: "a try statement",
    ast.With: "a with statement",
    ast.Delete: "a del statement",
}
MAX_CONSTANT_ARRAY = 4096


@dataclass(frozen=True)
class Constant:
    """A global a kernel reads, frozen for code generation.

    ``kind`` is ``"module"``, ``"value"`` (number, tuple or small array) or ``"function"``
    (then ``helper`` is its :class:`Kernel` and ``definition`` its own ``def``, renamed).
    ``source`` is plain Python that defines ``name`` (for a function: the constants it reads
    first, then its ``def``); backends decorate functions as they need.
    """

    name: str
    kind: str
    value: object
    source: str
    helper: object = None
    definition: str = ""


class Kernel:
    """A user kernel. Create with the :func:`kernel` decorator or :meth:`from_source`.

    Attributes
    ----------
    name : str
    func : callable
        The Python function (the reference backend calls it).
    params : tuple of str
    tree : ast.FunctionDef
        The parsed definition without decorators.
    """

    def __init__(self, func, *, name=None, source=None):
        if not isinstance(func, types.FunctionType):
            raise KernelError(f"mc.kernel expects a Python function, got {type(func).__name__}.")
        if name is not None and (not isinstance(name, str) or not name.isidentifier()):
            raise KernelError(f"mc.kernel: name must be a Python identifier (a str), got {name!r}.")
        self.func = func
        self.name = name or func.__name__
        self.source = source if source is not None else _read_source(func, self.name)
        self.first_line = func.__code__.co_firstlineno
        self.filename = func.__code__.co_filename
        self.tree = _parse_definition(self.source, self.name)
        self.params = _parameters(self.tree, self.name)
        self.free_names = _free_names(self.tree, self.params, self.name, self.where)
        self.written_params = frozenset(written_params(self))
        self._snapshot: tuple | None = None
        self._constants: tuple[Constant, ...] = ()
        self._helpers: tuple[Kernel, ...] = ()
        self._safety: dict = {}
        self._increment_uses: dict = {}
        self.derived: dict = {}  # kernels generated from this one (mixed-argument wrappers), by structure

    @classmethod
    def from_source(cls, source: str, *, name=None, namespace=None) -> "Kernel":
        """Build a kernel from the text of one ``def`` (for generated kernels).

        Examples
        --------
        >>> import meshchain as mc
        >>> k = mc.Kernel.from_source("def inc(a):\\n    a[0] += 1\\n")
        >>> k.params
        ('a',)
        """
        namespace = {} if namespace is None else dict(namespace)
        try:
            code = compile(textwrap.dedent(source), f"<meshchain kernel {name or 'source'}>", "exec")
        except SyntaxError as exc:
            raise KernelError(f"kernel {name or '(from_source)'!r}: cannot parse its source: {exc}") from exc
        before = set(namespace)
        exec(code, namespace)  # noqa: S102 - the user's own kernel text
        defined = [k for k, v in namespace.items() if k not in before and isinstance(v, types.FunctionType)]
        if len(defined) != 1:
            raise KernelError(f"Kernel.from_source: the source must define exactly one function, found {defined}.")
        return cls(namespace[defined[0]], name=name, source=textwrap.dedent(source))

    def where(self, node) -> str:
        """``file:line`` of an AST node of this kernel, for messages."""
        line = getattr(node, "lineno", 1)
        return f"{self.filename}:{self.first_line + line - 1}"

    def constants(self) -> tuple[Constant, ...]:
        """Resolve the kernel's globals now; cheap when nothing changed since last time.

        A change is a global rebound to another object, a constant array modified in
        place, or either of those in a helper function the kernel calls.
        """
        if self.unchanged():
            return self._constants
        env = self.func.__globals__
        values = [env.get(n, _MISSING) for n in self.free_names]
        self._constants = tuple(self._resolve(n, v) for n, v in zip(self.free_names, values) if not _is_builtin(n, v))
        self._helpers = tuple(c.helper for c in self._constants if c.kind == "function")
        self._snapshot = tuple(_fingerprint(v) for v in values)
        return self._constants

    def unchanged(self) -> bool:
        """True when the globals resolved by the last :meth:`constants` call are still current."""
        snapshot = self._snapshot
        if snapshot is None:
            return False
        if not snapshot:
            return True  # reads no globals
        env = self.func.__globals__
        for name, old in zip(self.free_names, snapshot):
            value = env.get(name, _MISSING)
            if value is old:
                continue  # the same object (numbers, modules, functions)
            new = _fingerprint(value)
            if new is not old and not (type(new) is tuple and new == old):
                return False
        return all(helper.unchanged() for helper in self._helpers)

    def non_increment_uses(self, param: str) -> list:
        """Cached :func:`meshchain.ir.analysis.non_increment_uses`."""
        if param not in self._increment_uses:
            self._increment_uses[param] = non_increment_uses(self, param)
        return self._increment_uses[param]

    def index_safety(self, shapes) -> bool:
        """Cached :func:`meshchain.ir.analysis.index_safety` for these view shapes and the
        current values of the module-level integers the kernel reads."""
        key = (tuple(shapes), integer_constants(self))
        if key not in self._safety:
            self._safety[key] = index_safety(self, key[0])
        return self._safety[key]

    def _resolve(self, name: str, value) -> Constant:
        if value is _MISSING and hasattr(builtins, name):
            raise KernelError(
                f"kernel {self.name!r} uses the builtin {name!r}, which kernels do not support; "
                f"allowed builtins: {', '.join(sorted(ALLOWED_BUILTINS))}."
            )
        if value is _MISSING:
            raise KernelError(f"kernel {self.name!r} uses {name!r}, which is not defined; define it at module level.")
        try:
            return describe_constant(name, value)
        except KernelError as exc:
            raise KernelError(f"kernel {self.name!r}: {exc}") from None

    def __call__(self, *args):
        return self.func(*args)

    def __repr__(self) -> str:
        return f"Kernel({self.name!r}, params={self.params})"


def kernel(func=None, *, name=None):
    """Decorator that turns a Python function into a meshchain :class:`Kernel`.

    Examples
    --------
    >>> import meshchain as mc
    >>> @mc.kernel(name="axpy")
    ... def f(x, y):
    ...     y[0] += 2.0 * x[0]
    >>> f.name
    'axpy'
    """
    if func is None:
        return lambda f: Kernel(f, name=name)
    return Kernel(func, name=name)


kernel.from_source = Kernel.from_source


# --- source and AST ---------------------------------------------------------------------------

_MISSING = object()


def _fingerprint(value):
    """What must stay the same for a resolved global to stay valid: the object itself, or
    for an array its contents (arrays can change in place)."""
    if isinstance(value, np.ndarray):
        return (value.dtype.str, value.shape, value.tobytes())
    return value


def _read_source(func, name: str) -> str:
    try:
        return textwrap.dedent(inspect.getsource(func))
    except (OSError, TypeError) as exc:
        raise KernelError(
            f"cannot read the source of kernel {name!r} ({exc}); define kernels in a .py file, "
            f"or build them with mc.Kernel.from_source(text)."
        ) from None


def _parse_definition(source: str, name: str) -> ast.FunctionDef:
    try:
        module = ast.parse(source)
    except SyntaxError as exc:
        raise KernelError(f"kernel {name!r}: cannot parse its source: {exc}") from exc
    defs = [n for n in module.body if isinstance(n, ast.FunctionDef)]
    if len(defs) != 1:
        raise KernelError(f"kernel {name!r}: expected one function definition, found {len(defs)}.")
    definition = defs[0]
    definition.decorator_list = []
    return definition


def _parameters(definition: ast.FunctionDef, name: str) -> tuple[str, ...]:
    a = definition.args
    if a.vararg or a.kwarg or a.kwonlyargs or a.posonlyargs or a.defaults:
        raise KernelError(
            f"kernel {name!r}: parameters must be plain positional names (one per loop argument), "
            f"without defaults, *args or **kwargs."
        )
    return tuple(p.arg for p in a.args)


def _free_names(definition: ast.FunctionDef, params, name: str, where) -> tuple[str, ...]:
    stored, loaded = set(params), []
    for node in ast.walk(definition):
        if node is not definition and type(node) in _FORBIDDEN:
            raise KernelError(f"kernel {name!r} at {where(node)}: {_FORBIDDEN[type(node)]} is not supported in kernels.")
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                loaded.append(node.id)
            else:
                stored.add(node.id)
    return tuple(dict.fromkeys(n for n in loaded if n not in stored))


def _is_builtin(name: str, value) -> bool:
    return value is _MISSING and name in ALLOWED_BUILTINS or (
        name in ALLOWED_BUILTINS and value is getattr(builtins, name, None)
    )


# --- constants --------------------------------------------------------------------------------


def describe_constant(name: str, value) -> Constant:
    """Freeze one global a kernel reads into a :class:`Constant` with generated source."""
    if isinstance(value, types.ModuleType):
        return Constant(name, "module", value, f"import {value.__name__} as {name}")
    if isinstance(value, Kernel):  # a kernel called as a helper: its source is known (from_source too)
        _helper_kernels.setdefault(value.func, value)
        value = value.func
    if isinstance(value, types.FunctionType):
        return _function_constant(name, value)
    literal = _literal(value)
    if literal is None:
        raise KernelError(
            f"global {name!r} of type {type(value).__name__} cannot be used inside a kernel; kernels may read "
            f"numbers, tuples of numbers, small NumPy arrays, modules and helper functions — pass other data "
            f"as a Dat or Global argument."
        )
    return Constant(name, "value", value, f"{name} = {literal}")


def _literal(value) -> str | None:
    if isinstance(value, (bool, np.bool_)):
        return repr(bool(value))
    if isinstance(value, (int, np.integer)):
        return repr(int(value))
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, np.floating):
        return f"_mc_np.{value.dtype.name}({float(value)!r})"
    if isinstance(value, tuple) and all(_literal(v) is not None and not isinstance(v, tuple) for v in value):
        return "(" + "".join(f"{_literal(v)}, " for v in value) + ")"
    if isinstance(value, np.ndarray) and value.dtype.kind in "iuf" and 0 < value.size <= MAX_CONSTANT_ARRAY:
        items = [repr(v) for v in value.ravel().tolist()]
        return f"_mc_np.array([{', '.join(items)}], dtype=_mc_np.{value.dtype.name}).reshape({value.shape})"
    return None


_helper_kernels = memo("kernels of helper functions", weak=True)


def _function_constant(name: str, func) -> Constant:
    helper = _helper_kernels.get(func)
    if helper is None:
        helper = _helper_kernels[func] = Kernel(func)
    body = ast.unparse(helper.tree).replace(f"def {helper.tree.name}(", f"def {name}(", 1)
    lines = [c.source for c in helper.constants()] + [body]
    return Constant(name, "function", func, "\n".join(lines), helper, body)
