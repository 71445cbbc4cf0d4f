"""Static checks of kernel indexing against the shapes of the argument views.

``index_safety(kernel, shapes)`` proves that every subscript of an argument view
stays in bounds (constant indices, module-level integers such as ``NVAR``, ``for i in
range(const)`` loop variables, and sums,
differences and products of those, floor division and remainder by a positive
constant: ``k[3 * i + j]`` over a flattened 3x3 element matrix; a view reshaped once by
``name = view.reshape((r, c))``, as assembly kernels take their matrix block), raises
:class:`KernelError` for an index proven out of bounds, and otherwise reports that
run-time bounds checks are needed.

An index is proven out of bounds only when the value outside its view is reached: a
bound that may not be (``i - i``, a remainder that wraps, a subscript under a branch or in
a kernel that can leave a loop early) makes the kernel need run-time checks instead of
failing. ``tests/test_kernel_analysis.py`` checks both verdicts against every iteration of
random index expressions.

Examples
--------
>>> import meshchain as mc
>>> from meshchain.ir.analysis import index_safety
>>> k = mc.Kernel.from_source("def f(a):\\n    for i in range(3):\\n        a[i] = 0\\n")
>>> index_safety(k, [(3,)])
True
>>> index_safety(k, [(4,)])
True
>>> flat = mc.Kernel.from_source("def g(k, y):\\n    for i in range(3):\\n        for j in range(3):\\n"
...                              "            y[i] += k[3 * i + j]\\n")
>>> index_safety(flat, [(9,), (3,)])
True
"""

from __future__ import annotations

import ast
import math
from typing import NamedTuple

import numpy as np

from ..core.errors import KernelError

__all__ = ["index_safety", "integer_constants", "written_params", "non_increment_uses"]


class Interval(NamedTuple):
    """The values an integer expression takes lie in ``[low, high]``; ``reached``: both
    bounds are taken by some iteration (so a bound outside a view is a proven error);
    ``names``: the loop variables the expression reads."""

    low: int
    high: int
    reached: bool = True
    names: frozenset = frozenset()


def _combined(left: Interval, right: Interval, low: int, high: int) -> Interval:
    """``[low, high]`` of a sum, difference or product of ``left`` and ``right``: its bounds
    are reached when theirs are and they read different loop variables (every pair of their
    values is then taken; ``i - i`` never takes ``low - high``)."""
    reached = left.reached and right.reached and not (left.names & right.names)
    return Interval(low, high, reached, left.names | right.names)


def _product(left: Interval, right: Interval) -> Interval:
    """``left * right``: the extremes of the corners."""
    corners = [a * b for a in (left.low, left.high) for b in (right.low, right.high)]
    return _combined(left, right, min(corners), max(corners))


def _by_constant(op, left: Interval, right: Interval) -> Interval | None:
    """``left // c`` or ``left % c`` for a constant ``c > 0`` (Python's rounding and sign);
    None for any other divisor."""
    if right.low != right.high or right.low <= 0:
        return None
    divisor = right.low
    if isinstance(op, ast.FloorDiv):
        return Interval(left.low // divisor, left.high // divisor, left.reached, left.names)
    if 0 <= left.low and left.high < divisor:  # no wrap: the remainder is the value itself
        return left
    return Interval(0, divisor - 1, False, left.names)


_SKIPS = (ast.Break, ast.Continue, ast.Return, ast.Raise, ast.Assert)  # later statements may not run
_CONDITIONAL = (ast.If, ast.While, ast.Try, ast.With, ast.IfExp, ast.BoolOp, ast.ListComp, ast.SetComp, ast.DictComp,
                ast.GeneratorExp)


def index_safety(kernel, shapes) -> bool:
    """Return True when all view subscripts are proven in bounds, False when unknown.

    Raises
    ------
    KernelError
        When a subscript is proven to fall outside its view.
    """
    shape_of = dict(zip(kernel.params, shapes))
    stored = _stored_names(kernel.tree)
    checker = _Checker(kernel, shape_of, stored)
    numbers = {name: Interval(value, value) for name, value in integer_constants(kernel)}
    checker.visit_body(kernel.tree.body, numbers)
    return checker.proven


def integer_constants(kernel) -> tuple:
    """``((name, value), ...)``: the module-level integers the kernel reads (compile-time
    constants: a kernel is compiled again, and checked again, when one is rebound)."""
    found = []
    namespace = kernel.func.__globals__
    for name in kernel.free_names:
        value = namespace.get(name)
        if type(value) is int or (isinstance(value, np.integer) and not isinstance(value, np.bool_)):
            found.append((name, int(value)))
    return tuple(found)


def written_params(kernel) -> set[str]:
    """Parameters the kernel assigns through a subscript (``p[...] = ...``, ``p[...] += ...``).

    Examples
    --------
    >>> import meshchain as mc
    >>> written_params(mc.Kernel.from_source("def f(a, b):\\n    b[0] = a[0]\\n"))
    {'b'}
    """
    params = set(kernel.params)
    written = set()
    for node in ast.walk(kernel.tree):
        if isinstance(node, ast.Subscript) and not isinstance(node.ctx, ast.Load):
            base = node.value
            while isinstance(base, ast.Subscript):
                base = base.value
            if isinstance(base, ast.Name) and base.id in params:
                written.add(base.id)
    return written


def non_increment_uses(kernel, param: str) -> list:
    """Nodes where ``param`` is used other than as ``param[...] += ...`` or ``-= ...``.

    An INC argument may only be incremented: backends may hand the kernel the running
    value, a zeroed buffer or (on GPUs) use atomics, so a kernel that reads it would get
    backend-dependent results.

    Examples
    --------
    >>> import meshchain as mc
    >>> k = mc.Kernel.from_source("def f(r):\\n    r[0] += 1.0\\n    r[1] = r[1] * 2\\n")
    >>> sorted({n.lineno for n in non_increment_uses(k, "r")})
    [3]
    """
    allowed = set()
    for node in ast.walk(kernel.tree):
        if isinstance(node, ast.AugAssign) and isinstance(node.op, (ast.Add, ast.Sub)):
            allowed.add(id(node.target))
    bad = []
    for node in ast.walk(kernel.tree):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == param:
            if id(node) not in allowed:
                bad.append(node)
        elif isinstance(node, ast.Name) and node.id == param and not _is_subscript_base(kernel.tree, node):
            bad.append(node)
    return sorted(bad, key=lambda n: (n.lineno, n.col_offset))


def _is_subscript_base(tree, name_node) -> bool:
    return any(isinstance(n, ast.Subscript) and n.value is name_node for n in ast.walk(tree))


def _stored_names(tree) -> dict[str, int]:
    """Count the assignments to each name. A plain ``for name in ...`` target counts only when
    a loop nested inside it binds the same name (the outer body then goes on with the inner
    loop's last value); loops one after another may reuse a name."""
    loops = [n for n in ast.walk(tree) if isinstance(n, ast.For) and isinstance(n.target, ast.Name)]
    rebinding = set()
    for loop in loops:
        inner = [n for statement in loop.body for n in ast.walk(statement)
                 if isinstance(n, ast.For) and isinstance(n.target, ast.Name) and n.target.id == loop.target.id]
        if inner:
            rebinding.add(loop.target.id)
    loop_targets = {id(loop.target) for loop in loops if loop.target.id not in rebinding}
    counts: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load) and id(node) not in loop_targets:
            counts[node.id] = counts.get(node.id, 0) + 1
    return counts


class _Checker:
    def __init__(self, kernel, shape_of, stored):
        self.kernel, self.shape_of, self.stored = kernel, shape_of, stored
        self.proven = all(self.stored.get(p, 0) == 0 for p in shape_of)
        self.skips = any(isinstance(n, _SKIPS) for n in ast.walk(kernel.tree))  # then no subscript is sure to run
        self.conditional = 0  # inside a branch, a short-circuit or a comprehension: may not run

    def visit_body(self, statements, env):
        for statement in statements:
            self.visit(statement, env)

    def visit(self, node, env):
        if isinstance(node, ast.Assign) and self.reshaped_view(node):
            return
        if isinstance(node, ast.For):
            self.visit(node.iter, env)
            inner = dict(env)
            target = node.target
            if isinstance(target, ast.Name):
                span = self.range_interval(node.iter, env)
                if span is not None and self.stored.get(target.id, 0) == 0:
                    inner[target.id] = span._replace(names=frozenset([target.id]))
                else:
                    inner.pop(target.id, None)
            self.visit_body(node.body, inner)
            self.visit_body(node.orelse, env)
            return
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in self.shape_of:
            self.check_subscript(node, env)
            self.visit(node.slice, env)
            return
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Subscript):
            self.proven = False  # chained indexing a[i][j]: the outer index is not checked
        if isinstance(node, ast.Name) and node.id in self.shape_of:
            self.proven = False  # the whole view escapes (call argument, alias, attribute): cannot prove
            return
        conditional = isinstance(node, _CONDITIONAL)
        self.conditional += conditional
        for child in ast.iter_child_nodes(node):
            self.visit(child, env)
        self.conditional -= conditional

    def reshaped_view(self, node) -> bool:
        """``name = view.reshape((r, c))`` with constant extents of the view's size, ``name``
        assigned nowhere else (the matrix block of an assembly kernel): ``name`` is then a view
        of that shape, its subscripts checked like a parameter's. False for anything else."""
        value = node.value
        if not (len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and isinstance(value, ast.Call)
                and isinstance(value.func, ast.Attribute) and value.func.attr == "reshape"
                and isinstance(value.func.value, ast.Name) and value.func.value.id in self.shape_of
                and not value.keywords):
            return False
        name, base = node.targets[0].id, value.func.value.id
        extents = value.args[0].elts if len(value.args) == 1 and isinstance(value.args[0], ast.Tuple) else value.args
        if not all(isinstance(e, ast.Constant) and type(e.value) is int and e.value > 0 for e in extents):
            return False
        shape = tuple(e.value for e in extents)
        flat = self.shape_of[base]
        if name in self.shape_of or self.stored.get(name, 0) != 1 or len(flat) != 1 or math.prod(shape) != flat[0]:
            return False
        self.shape_of[name] = shape
        return True

    def range_interval(self, call, env) -> Interval | None:
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "range"):
            return None
        bounds = [self.interval(a, env) for a in call.args]
        if call.keywords or not 1 <= len(bounds) <= 2 or any(b is None or b[0] != b[1] for b in bounds):
            return None
        start, stop = (0, bounds[0][0]) if len(bounds) == 1 else (bounds[0][0], bounds[1][0])
        return Interval(start, stop - 1) if stop > start else None

    def interval(self, node, env) -> Interval | None:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return Interval(node.value, node.value)
        if isinstance(node, ast.Name):
            return env.get(node.id)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            inner = self.interval(node.operand, env)
            return None if inner is None else Interval(-inner.high, -inner.low, inner.reached, inner.names)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod)):
            left, right = self.interval(node.left, env), self.interval(node.right, env)
            if left is None or right is None:
                return None
            if isinstance(node.op, ast.Add):
                return _combined(left, right, left.low + right.low, left.high + right.high)
            if isinstance(node.op, ast.Sub):
                return _combined(left, right, left.low - right.high, left.high - right.low)
            if isinstance(node.op, ast.Mult):
                return _product(left, right)
            return _by_constant(node.op, left, right)
        return None

    def check_subscript(self, node, env):
        name = node.value.id
        shape = self.shape_of[name]
        indices = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if len(indices) > len(shape):
            self.fail(node, f"{name} has {len(shape)} dimension(s) (view shape {shape}) but is indexed with {len(indices)}")
        for axis, index in enumerate(indices):
            span = self.interval(index, env)
            if span is None:
                self.proven = False
                continue
            extent = shape[axis]
            if span.low < -extent or span.high >= extent:
                if not span.reached or self.conditional or self.skips:  # may not be taken: checked at run time
                    self.proven = False
                    continue
                self.fail(node, f"index {ast.unparse(index)} of {name} reaches {span.low if span.low < -extent else span.high}, "
                                f"outside axis {axis} of its view of shape {shape}")

    def fail(self, node, message):
        raise KernelError(
            f"kernel {self.kernel.name!r} at {self.kernel.where(node)}: {message}; "
            f"check the argument's dim/arity in the par_loop or the kernel's indexing."
        )
