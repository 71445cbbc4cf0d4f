"""Static checks of kernel indexing against the shapes of the argument views.

``index_safety(kernel, shapes)`` proves that every subscript of an argument view
stays in bounds (constant indices, ``for i in range(const)`` loop variables and
sums of those), raises :class:`KernelError` for an index proven out of bounds, and
otherwise reports that run-time bounds checks are needed.

Examples
--------
>>> import meshchain as mc
>>> from meshchain.ir.analysis import index_safety
>>> k = mc.Kernel.from_source("def f(a):\\n    for i in range(3):\\n        a[i] = 0\\n")
>>> index_safety(k, [(3,)])
True
>>> index_safety(k, [(4,)])
True
"""

from __future__ import annotations

import ast

from ..core.errors import KernelError

__all__ = ["index_safety", "written_params", "non_increment_uses"]

Interval = tuple[int, int]


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
    checker.visit_body(kernel.tree.body, {})
    return checker.proven


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
    the name is bound by more than one loop (nested loops reusing a name leave it changed)."""
    loop_targets = [n.target for n in ast.walk(tree) if isinstance(n, ast.For) and isinstance(n.target, ast.Name)]
    loops_per_name: dict[str, int] = {}
    for target in loop_targets:
        loops_per_name[target.id] = loops_per_name.get(target.id, 0) + 1
    single_loop_targets = {id(t) for t in loop_targets if loops_per_name[t.id] == 1}
    counts: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load) and id(node) not in single_loop_targets:
            counts[node.id] = counts.get(node.id, 0) + 1
    return counts


class _Checker:
    def __init__(self, kernel, shape_of, stored):
        self.kernel, self.shape_of, self.stored = kernel, shape_of, stored
        self.proven = all(self.stored.get(p, 0) == 0 for p in shape_of)

    def visit_body(self, statements, env):
        for statement in statements:
            self.visit(statement, env)

    def visit(self, node, env):
        if isinstance(node, ast.For):
            self.visit(node.iter, env)
            inner = dict(env)
            target = node.target
            if isinstance(target, ast.Name):
                span = self.range_interval(node.iter, env)
                if span is not None and self.stored.get(target.id, 0) == 0:
                    inner[target.id] = span
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
        for child in ast.iter_child_nodes(node):
            self.visit(child, env)

    def range_interval(self, call, env) -> Interval | None:
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "range"):
            return None
        bounds = [self.interval(a, env) for a in call.args]
        if call.keywords or not 1 <= len(bounds) <= 2 or any(b is None or b[0] != b[1] for b in bounds):
            return None
        start, stop = (0, bounds[0][0]) if len(bounds) == 1 else (bounds[0][0], bounds[1][0])
        return (start, stop - 1) if stop > start else None

    def interval(self, node, env) -> Interval | None:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return (node.value, node.value)
        if isinstance(node, ast.Name):
            return env.get(node.id)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            inner = self.interval(node.operand, env)
            return None if inner is None else (-inner[1], -inner[0])
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            left, right = self.interval(node.left, env), self.interval(node.right, env)
            if left is None or right is None:
                return None
            if isinstance(node.op, ast.Add):
                return (left[0] + right[0], left[1] + right[1])
            return (left[0] - right[1], left[1] - right[0])
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
            if span[0] < -extent or span[1] >= extent:
                self.fail(node, f"index {ast.unparse(index)} of {name} reaches {span[0] if span[0] < -extent else span[1]}, "
                                f"outside axis {axis} of its view of shape {shape}")

    def fail(self, node, message):
        raise KernelError(
            f"kernel {self.kernel.name!r} at {self.kernel.where(node)}: {message}; "
            f"check the argument's dim/arity in the par_loop or the kernel's indexing."
        )
