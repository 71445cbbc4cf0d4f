"""An inlined loop's elements in chunks of gathers, vectorised computing and scatters.

A loop through maps reads its operands from scattered rows and adds its results to scattered
rows, so LLVM runs its element loop one element at a time: the divisions and square roots of a
flux kernel (MG-CFD's ``compute_flux_edge``: 8 and 5 per edge) then take most of its time, one
at a time, where the processor could do 4 or 8 at once. OP2's vectorised back end gathers the
operands of a few elements into contiguous lanes, computes them with vector instructions and
scatters the results one element after another; this module makes that form of the generated
element loop.

For a chunk of :data:`CHUNK` consecutive elements:

1. **gather**: each element's map values (``_mc_i...``) are read and each value the body loads
   (``_mc_v<arg>_<component> = _mc_d...[row, component]``) is copied into a contiguous buffer,
   one row of ``CHUNK`` values per loaded value;
2. **compute**: the body runs element after element reading those rows and writing each of its
   stores' values (``_mc_d<slot>[row, component] += value`` or ``= value``) into a row of a
   second buffer; nothing in it touches a dat, a map or the element number, its buffers are at
   constant distances of ``CHUNK`` values, so LLVM's loop vectoriser runs it with vector
   divisions and square roots;
3. **scatter**: element after element, its stores are made in the body's order from the second
   buffer.

Every element computes the same operations in the same order as in the one-loop form (vector
division and square root are correctly rounded, as the scalar ones; nothing is reassociated), and
the stores reach every row in the same order, so the results are the same bits. It is exact
because the gathered values cannot change within the chunk: a dat a loop reads is never written in
it (checked here again: the form is not made otherwise).

The form is made (:func:`chunked_lines`) for a loop over a range of a set's elements whose
inlined body

* loads float64 values only, and stores float64 values only, each store a statement of the
  body's top level (made once per element, in order), ``+=`` or ``=``;
* reads nothing else from its arrays: no reduction into a global (a loop-carried sum would not
  vectorise without reordering it), no value read through a non-constant index;
* divides, takes square roots or calls helper functions, at least once per :data:`COSTLY_SHARE`
  values it gathers and stores: the work that vector instructions speed up, against the cost of
  moving the values through the buffers. A body of adds and multiplies keeps the one-loop form:
  Airfoil's ``res_calc`` (2 divisions an edge for 14 values read and 8 added) ran 2-3 % slower in
  chunks, its ``adt_calc`` (7 divisions and square roots for 13 values) 1.7x faster. So does a
  body calling a library function that has no vector form (``math.exp``, ``math.sin``, a
  non-integer power), which would run one element at a time anyway.

MG-CFD's flux kernel over 709 792 edges (``channel_bump(32)``'s finest level, 1 thread, AMD EPYC
with AVX-512): 22.3 ms as one loop, 10.5 ms in chunks of 64 (11.1-11.4 in chunks of 128 or 256,
34 in chunks of 512, whose buffers outgrow the first-level cache), the same bits.

Examples
--------
>>> lines = ["_mc_u = _mc_np.uint64(_mc_e)", "_mc_i0_0 = _mc_m0[_mc_u, 0]", "_mc_v0_0 = _mc_d0[_mc_i0_0, 0]",
...          "_mc_d1[_mc_i0_0, 0] += 1.0 / _mc_v0_0"]
>>> out = chunked_lines(lines, "_mc_starts[_mc_b]", "_mc_starts[_mc_b + 1]", {0: "float64", 1: "float64"})
>>> print("\\n".join(out))  # doctest: +NORMALIZE_WHITESPACE
_mc_vg = _mc_np.empty(64)
_mc_vo = _mc_np.empty(64)
for _mc_c0 in range(_mc_starts[_mc_b], _mc_starts[_mc_b + 1], 64):
    _mc_n = min(_mc_c0 + 64, _mc_starts[_mc_b + 1]) - _mc_c0
    for _mc_k in range(_mc_n):
        _mc_e = _mc_c0 + _mc_k
        _mc_u = _mc_np.uint64(_mc_e)
        _mc_i0_0 = _mc_m0[_mc_u, 0]
        _mc_vg[_mc_k] = _mc_d0[_mc_i0_0, 0]
    for _mc_k in range(_mc_n):
        _mc_v0_0 = _mc_vg[_mc_k]
        _mc_vo[_mc_k] = 1.0 / _mc_v0_0
    for _mc_k in range(_mc_n):
        _mc_e = _mc_c0 + _mc_k
        _mc_u = _mc_np.uint64(_mc_e)
        _mc_i0_0 = _mc_m0[_mc_u, 0]
        _mc_d1[_mc_i0_0, 0] += _mc_vo[_mc_k]
"""

from __future__ import annotations

import ast
import re

__all__ = ["CHUNK", "COSTLY_SHARE", "chunked_lines"]

#: Elements per chunk: the buffers of a chunk stay in the first-level cache (see the module docstring).
CHUNK = 64
#: Values gathered and stored per costly operation (a division, a square root, a helper call) at most.
COSTLY_SHARE = 4

_DAT = re.compile(r"_mc_d(\d+)$")
_MAP = re.compile(r"_mc_m\d+$")
_INDEX_NAMES = re.compile(r"_mc_(u|i\d+_\d+)$")
_VALUE = re.compile(r"_mc_v\d+_\d+$")
_LOCAL = re.compile(r"_mc_[vh]\d+_\d+$")  # a value gathered, or the local of one of the element's own rows
_FREE_CALLS = {"min", "max", "abs", "float", "int", "bool"}  # cheap: no reason to vectorise alone
# math's (and NumPy's) functions LLVM computes with vector instructions
_VECTOR_FUNCTIONS = {"sqrt", "fabs", "floor", "ceil", "trunc", "copysign", "float64", "int64"}


def chunked_lines(element: list[str], lo: str, hi: str, dtypes: dict) -> list[str] | None:
    """The lines that run ``element`` (the statements of one element ``_mc_e`` of the range
    ``[lo, hi)``, a loop's inlined body with its map and value loads) in chunks (see the module
    docstring), or None where that form is not made. ``dtypes``: each dat slot's dtype name."""
    try:
        statements = ast.parse("\n".join(element)).body
    except SyntaxError:
        return None
    parts = _Parts(dtypes).split(statements)
    if parts is None:
        return None
    indices, loads, body, stores = parts
    nodes = [node for statement in body for node in ast.walk(statement)]
    moved = len(loads) + len(stores)
    if not stores or sum(map(_costly, nodes)) * COSTLY_SHARE < moved or any(map(_scalar_only, nodes)):
        return None
    n = CHUNK
    return [f"_mc_vg = _mc_np.empty({max(1, len(loads)) * n})", f"_mc_vo = _mc_np.empty({len(stores) * n})",
            f"for _mc_c0 in range({lo}, {hi}, {n}):",
            f"    _mc_n = min(_mc_c0 + {n}, {hi}) - _mc_c0",
            "    for _mc_k in range(_mc_n):",
            "        _mc_e = _mc_c0 + _mc_k",
            *("        " + line for line in indices),
            *(f"        _mc_vg[{_at(j)}] = {source}" for j, (_, source) in enumerate(loads)),
            "    for _mc_k in range(_mc_n):",
            *(f"        {name} = _mc_vg[{_at(j)}]" for j, (name, _) in enumerate(loads)),
            *("        " + line for statement in body for line in ast.unparse(statement).splitlines()),
            "    for _mc_k in range(_mc_n):",
            "        _mc_e = _mc_c0 + _mc_k",
            *("        " + line for line in indices),
            *(f"        {target} {op} _mc_vo[{_at(j)}]" for j, (target, op, _) in enumerate(stores))]


def _at(row: int) -> str:
    """The place of element ``_mc_k`` in buffer row ``row``."""
    return f"{row * CHUNK} + _mc_k" if row else "_mc_k"


_OPS = {ast.Add: "+=", ast.Sub: "-="}


class _Parts:
    """An element's statements split into the three phases (:meth:`split`). A row of the
    element's own (``_mc_d<slot>[_mc_u, c]``, a direct argument) that the body reads or writes is
    kept in a local (``_mc_h<slot>_<c>``) while the body runs: ``=`` sets it, ``+=`` and ``-=``
    add to it (the operation the row would get), a read reads it (its old value gathered where
    the body reads or adds to it before setting it), and the last value of each row the body
    writes is stored; no other element touches that row, so this is exact. A row reached through
    a map is stored from its statement's value, which must read no dat."""

    def __init__(self, dtypes: dict):
        self.dtypes = dtypes
        self.loads: list = []  # (local, the expression gathered)
        self.loaded: set = set()  # (slot, row name) of every value gathered
        self.mapped: set = set()  # slots stored through a map
        self.set: set = set()  # (slot, component) of the element's own rows whose local holds a value by now
        self.written: list = []  # those the body writes, in the order of their first store
        self.stores: list = []  # (target, "+=", "-=" or "=", local or None)

    def split(self, statements):
        """``(index lines, loads, body, stores)``, or None where the chunked form cannot be made."""
        indices, body = [], []
        for statement in statements:
            target = statement.targets[0] if isinstance(statement, ast.Assign) and len(statement.targets) == 1 else None
            if isinstance(target, ast.Name) and _INDEX_NAMES.match(target.id) and not body and not self.loads:
                if not _reads_only(statement.value, index=True):
                    return None
                indices.append(ast.unparse(statement))
                continue
            if isinstance(target, ast.Name) and _VALUE.match(target.id):
                place = _dat_place(statement.value)
                if place is None or not self._gathered(target.id, place, statement.value):
                    return None
                continue
            store = _store(statement)
            made = self._plain(statement) if store is None else self._store(*store)
            if made is None:
                return None
            body.append(made)
        finished = self._finish(body)
        return None if finished is None else (indices, self.loads, body, self.stores)

    def _gathered(self, local: str, place, source) -> bool:
        slot, row, _ = place
        if self.dtypes.get(slot) != "float64":
            return False
        self.loads.append((local, ast.unparse(source)))
        self.loaded.add((slot, row))
        return True

    def _plain(self, statement):
        """A statement of the body that stores nothing: its reads of the element's own written rows
        read their locals; anything else it reads must be a local."""
        statement = _OwnRows(self).visit(statement)
        return statement if statement is not None and _reads_only(statement, index=False) else None

    def _store(self, slot: int, target, op: str, value):
        """A store into a dat row (:func:`_store`'s parts) made in the body as a write of its value:
        into the buffer (a row through a map) or into the row's local (an own row)."""
        _, row, component = _dat_place(target)
        if self.dtypes.get(slot) != "float64":
            return None
        value = _OwnRows(self).visit(value)
        if value is None or not _reads_only(value, index=False):
            return None
        if row != "_mc_u":  # through a map: its value into the buffer, stored in the body's order
            self.mapped.add(slot)
            self.stores.append((ast.unparse(target), op, None))
            return ast.parse(f"_mc_vo[{_at(len(self.stores) - 1)}] = {ast.unparse(value)}").body[0]
        local = self._own(slot, component, read=op != "=")
        if local is None:
            return None
        self.set.add((slot, component))
        if (slot, component) not in self.written:
            self.written.append((slot, component))
        # "=" as a store into the float64 row would convert: the local is a float64 whatever the value's type
        expression = f"_mc_np.float64({ast.unparse(value)})" if op == "=" else f"{local} {op[0]} ({ast.unparse(value)})"
        return ast.parse(f"{local} = {expression}").body[0]

    def _own(self, slot: int, component: int, *, read: bool) -> str | None:
        """The local of the element's own row ``slot``, ``component``; its old value gathered
        first where it is ``read`` before being set."""
        key, local = (slot, component), _own_local(slot, component)
        if read and key not in self.set:
            if not self._gathered(local, (slot, "_mc_u", component), _row(slot, "_mc_u", component)):
                return None
            self.set.add(key)
        return local

    def _finish(self, body):
        """The stores of the element's own rows (their last values), after the body; None where a
        dat is read and written through other rows (its values could change within a chunk)."""
        own_slots = {slot for slot, _ in self.written}
        if any(slot in self.mapped for slot, _ in self.loaded) or own_slots & self.mapped:
            return None
        if any(slot in own_slots and row != "_mc_u" for slot, row in self.loaded):
            return None
        for slot, component in self.written:
            local = _own_local(slot, component)
            self.stores.append((ast.unparse(_row(slot, "_mc_u", component)), "=", local))
            body.append(ast.parse(f"_mc_vo[{_at(len(self.stores) - 1)}] = {local}").body[0])
        return body


class _OwnRows(ast.NodeTransformer):
    """Reads of the element's own rows replaced by their locals (:class:`_Parts`), the old value
    gathered where the body has not set it; reads through a map left for the caller to refuse."""

    def __init__(self, parts: _Parts):
        self.parts, self.refused = parts, False

    def visit(self, node):
        result = super().visit(node)
        return None if self.refused else result

    def visit_Subscript(self, node):  # noqa: N802 - ast's visitor naming
        place = _dat_place(node)
        if place is None:
            return self.generic_visit(node)
        slot, row, component = place
        if row != "_mc_u" or not isinstance(node.ctx, ast.Load):
            return node  # a row through a map, or a store inside a block: _reads_only refuses it
        local = self.parts._own(slot, component, read=True)
        if local is None:
            self.refused = True
            return node
        return ast.copy_location(ast.Name(id=local, ctx=ast.Load()), node)


def _own_local(slot: int, component: int) -> str:
    """The local holding the element's own row ``slot``, ``component`` while the body runs."""
    return f"_mc_h{slot}_{component}"


def _row(slot: int, row: str, component: int):
    return ast.parse(f"_mc_d{slot}[{row}, {component}]", mode="eval").body


def _dat_place(node):
    """``(slot, row name, component)`` of ``_mc_d<slot>[row, component]`` whose row is an index
    name and component a constant, else None."""
    if not (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)):
        return None
    found = _DAT.match(node.value.id)
    index = node.slice
    if found is None or not (isinstance(index, ast.Tuple) and len(index.elts) == 2):
        return None
    row, component = index.elts
    if not (isinstance(row, ast.Name) and _INDEX_NAMES.match(row.id) and isinstance(component, ast.Constant)
            and type(component.value) is int):
        return None
    return int(found.group(1)), row.id, component.value


def _store(statement):
    """``(slot, target, "+=", "-=" or "=", value)`` of a top-level store into a dat row, else None."""
    if isinstance(statement, ast.AugAssign) and type(statement.op) in _OPS:
        target, op, value = statement.target, _OPS[type(statement.op)], statement.value
    elif isinstance(statement, ast.Assign) and len(statement.targets) == 1:
        target, op, value = statement.targets[0], "=", statement.value
    else:
        return None
    place = _dat_place(target)
    return None if place is None else (place[0], target, op, value)


def _reads_only(tree, *, index: bool) -> bool:
    """Whether ``tree`` uses no generated name but the locals (``_mc_v...``, ``_mc_h...``) and NumPy
    (``index``: also the element, the map values and the maps, for an index line)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id.startswith("_mc_"):
            if _LOCAL.match(node.id) or node.id == "_mc_np":
                continue
            if index and (node.id == "_mc_e" or _INDEX_NAMES.match(node.id) or _MAP.match(node.id)):
                continue
            return False
        if isinstance(node, (ast.Subscript, ast.Attribute)) and isinstance(getattr(node, "ctx", None), ast.Store):
            return False
    return True


def _costly(node) -> bool:
    """Whether ``node`` is work vector instructions speed up: a division, a square root, a call
    of a helper (inlined: MG-CFD's ``euler_state`` divides and takes a root)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)):
        return True
    if isinstance(node, ast.Call):
        name = _called(node)
        return name == "sqrt" or (isinstance(node.func, ast.Name) and name not in _FREE_CALLS)
    return False


def _scalar_only(node) -> bool:
    """Whether ``node`` keeps LLVM from vectorising the computing: a call of a library function
    that has no vector form (``math.exp``, ``math.log``, ``math.sin`` ...: one call per element),
    or a power that is not a small integer one (``x ** 0.5`` calls ``pow``)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return _called(node) not in _VECTOR_FUNCTIONS
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        exponent = node.right
        return not (isinstance(exponent, ast.Constant) and type(exponent.value) is int and 0 <= exponent.value <= 4)
    return False


def _called(call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
