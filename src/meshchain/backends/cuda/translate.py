"""Translate a kernel's Python AST into a CUDA C ``__device__`` function.

The subset kernels use is supported: scalar arithmetic (Python semantics for ``/``,
``//``, ``%`` and ``**``), comparisons, ``and``/``or``/``not``, conditional
expressions, ``if``/``elif``/``else``, ``for ... in range(...)``, ``while``,
``break``/``continue``, local scalars (types inferred as Numba does), small local
arrays (``np.zeros``/``np.ones``/``np.empty`` of a constant shape), indexing of the
argument views, ``math``/``numpy`` functions, module constants (numbers, tuples,
small arrays) and helper functions (translated too, one version per argument
types). Anything else raises :class:`~meshchain.core.errors.KernelError` naming the
kernel, the line and the construct.

Examples
--------
>>> import meshchain as mc
>>> from meshchain.backends.cuda.translate import translate
>>> from meshchain.backends.cuda.types import View
>>> k = mc.Kernel.from_source("def f(a, b):\\n    t = a[0] * 2\\n    b[0] = t if t > 0 else -t\\n")
>>> unit = translate(k, [View("double", (1,), const=True), View("double", (1,))])
>>> print(unit.functions[-1].splitlines()[0])
__device__ void mc_kernel_f(const double* u_a, double* u_b)
>>> "u_t = (u_a[0] * 2LL);" in unit.functions[-1]
True
"""

from __future__ import annotations

import ast
import types
from dataclasses import dataclass, field

import numpy as np

from ...core.errors import AccessModeError, KernelError
from .types import BOOL, DOUBLE, INT, View, c_type, is_float, is_int, is_unsigned, join, literal, promote, scalar_type

__all__ = ["translate", "TranslationUnit"]

_BINARY = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^",
           ast.LShift: "<<", ast.RShift: ">>"}
_COMPARE = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}
_FLOAT_1 = {"sqrt", "exp", "log", "log10", "log2", "log1p", "expm1", "sin", "cos", "tan", "asin", "acos", "atan",
            "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc", "lgamma", "cbrt", "fabs"}
_NUMPY_ALIASES = {"arcsin": "asin", "arccos": "acos", "arctan": "atan", "arcsinh": "asinh", "arccosh": "acosh",
                  "arctanh": "atanh", "arctan2": "atan2", "power": "pow", "absolute": "abs", "minimum": "min",
                  "maximum": "max", "fmin": "min", "fmax": "max", "gamma": "tgamma"}
_FLOAT_2 = {"atan2", "hypot", "copysign", "fmod"}
_PREDICATES = {"isnan", "isinf", "isfinite"}
_ROUNDING = {"floor", "ceil", "trunc"}
_CASTS = {"float64": DOUBLE, "float32": "float", "int64": INT, "int32": "int", "float_": DOUBLE, "bool_": BOOL}
_ALLOCATORS = {"zeros": "0", "ones": "1", "empty": None}
_MATH_CONSTANTS = {"pi": np.pi, "e": np.e, "inf": np.inf, "nan": np.nan, "tau": 2 * np.pi}


@dataclass
class TranslationUnit:
    """The device functions of one kernel: helpers first, the kernel last; ``constants``
    holds the definitions of the constant arrays they read."""

    functions: list = field(default_factory=list)
    constants: dict = field(default_factory=dict)
    helpers: dict = field(default_factory=dict)  # (function, argument types) -> (name, return type)

    @property
    def source(self) -> str:
        return "\n".join([*self.constants.values(), *self.functions])


def translate(kernel, param_types, *, name=None, unit=None) -> TranslationUnit:
    """Translate ``kernel`` for arguments of ``param_types`` (:class:`View` or C scalar names).

    Returns the :class:`TranslationUnit`; the kernel's function is ``unit.functions[-1]``, named
    ``name`` (default ``mc_kernel_<kernel name>``) and returning ``void``.
    """
    unit = TranslationUnit() if unit is None else unit
    _FunctionTranslator(kernel, list(param_types), unit, name or f"mc_kernel_{kernel.name}", stack=()).run()
    return unit


class _FunctionTranslator:
    """Two passes over one function: infer the local types (until they settle), then emit."""

    def __init__(self, kernel, param_types, unit: TranslationUnit, name: str, *, stack, returns=False):
        self.kernel, self.unit, self.name, self.stack = kernel, unit, name, stack
        if len(param_types) != len(kernel.params):
            raise KernelError(f"kernel {kernel.name!r} takes {len(kernel.params)} arguments, got {len(param_types)}.")
        self.params = dict(zip(kernel.params, param_types))
        self.constants = {c.name: c for c in kernel.constants()}
        self.locals: dict = {}
        self.arrays: dict = {}
        self.returns = returns
        self.return_type = None
        self.emitting = False
        self.in_condition = False
        self.counter = 0

    def run(self) -> str:
        for _ in range(6):
            before = (dict(self.locals), self.return_type)
            self.counter = 0
            self.block(self.kernel.tree.body)
            if (dict(self.locals), self.return_type) == before:
                break
        self.emitting, self.counter = True, 0
        body = self.block(self.kernel.tree.body)
        result = self.return_type if self.returns and self.return_type is not None else "void"
        params = ", ".join(f"{t.pointer() if isinstance(t, View) else t} u_{p}" for p, t in self.params.items())
        declarations = [f"    {t} u_{n};" for n, t in self.locals.items()]
        declarations += [f"    {v.ctype} u_{n}[{v.size}];" for n, v in self.arrays.items()]
        text = "\n".join([f"__device__ {result} {self.name}({params})", "{", *declarations, *body, "}"])
        self.unit.functions.append(text)
        return result

    # --- errors -------------------------------------------------------------------------------

    def fail(self, node, what: str, fix: str = "") -> KernelError:
        where = self.kernel.where(node)
        text = f"kernel {self.kernel.name!r} at {where}: {what} is not supported by the CUDA translator"
        return KernelError(text + (f"; {fix}" if fix else "."))

    # --- statements ---------------------------------------------------------------------------

    def block(self, statements, depth: int = 1) -> list:
        lines = []
        for statement in statements:
            lines += ["    " * depth + line if line else line for line in self.statement(statement, depth)]
        return lines

    def statement(self, node, depth) -> list:
        method = getattr(self, f"do_{type(node).__name__}", None)
        if method is None:
            raise self.fail(node, f"a {type(node).__name__.lower()} statement ({ast.unparse(node).splitlines()[0]!r})")
        return method(node, depth)

    def do_Pass(self, node, depth):
        return [";"]

    def do_Break(self, node, depth):
        return ["break;"]

    def do_Continue(self, node, depth):
        return ["continue;"]

    def do_Expr(self, node, depth):
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return []  # a docstring
        if not isinstance(node.value, ast.Call):
            raise self.fail(node, f"the expression statement {ast.unparse(node)!r}")
        code, _ = self.expr(node.value, statement=True)
        return [f"{code};"]

    def do_Return(self, node, depth):
        if node.value is None:
            return ["return;"]
        if not self.returns:
            raise self.fail(node, "returning a value from a kernel", "kernels write their results to arguments.")
        code, t = self.scalar(node.value)
        self.return_type = join(self.return_type, t)
        return [f"return {code};"]

    def do_If(self, node, depth):
        test, _ = self.condition(node.test)
        lines = [f"if ({test}) {{", *self.block(node.body, 1), "}"]
        if node.orelse:
            lines[-1] = "} else {"
            lines += [*self.block(node.orelse, 1), "}"]
        return lines

    def do_While(self, node, depth):
        if node.orelse:
            raise self.fail(node, "'while ... else'")
        test, _ = self.condition(node.test)
        return [f"while ({test}) {{", *self.block(node.body, 1), "}"]

    def do_For(self, node, depth):
        if node.orelse:
            raise self.fail(node, "'for ... else'")
        call = node.iter
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "range"
                and not call.keywords and 1 <= len(call.args) <= 3):
            raise self.fail(node, f"iterating over {ast.unparse(call)!r}", "loop with 'for i in range(...)'.")
        if not isinstance(node.target, ast.Name):
            raise self.fail(node, "a loop target that is not a plain name")
        bounds = [self.integer(a) for a in call.args]
        start, stop = ("0LL", bounds[0]) if len(bounds) == 1 else (bounds[0], bounds[1])
        step = bounds[2] if len(bounds) == 3 else "1LL"
        if len(bounds) == 3:
            sign = _constant_sign(call.args[2])
            if sign is None:
                raise self.fail(node, "a range step that is not a constant", "use a literal step such as 1 or -1.")
        else:
            sign = 1
        self.assign_type(node.target.id, INT, node)
        counter, limit = self.fresh("mc_i"), self.fresh("mc_n")
        compare = "<" if sign > 0 else ">"
        header = (f"for (long long {counter} = {start}, {limit} = {stop}; {counter} {compare} {limit}; "
                  f"{counter} += {step}) {{")
        return ["{", header, f"    u_{node.target.id} = {counter};", *self.block(node.body, 1), "}", "}"]

    def do_Assign(self, node, depth):
        if len(node.targets) != 1:
            raise self.fail(node, "chained assignment (a = b = ...)")
        target = node.targets[0]
        if isinstance(target, ast.Tuple):
            return self.unpack(node, target)
        if isinstance(target, ast.Name) and _allocation(node.value, self.constants) is not None:
            return self.allocate(target.id, node.value)
        code, t = self.scalar(node.value)
        return self.store(target, code, t, node)

    def do_AnnAssign(self, node, depth):
        if node.value is None:
            return []
        return self.do_Assign(ast.Assign(targets=[node.target], value=node.value, lineno=node.lineno), depth)

    def do_AugAssign(self, node, depth):
        current = ast.copy_location(_as_load(node.target), node)
        value = ast.copy_location(ast.BinOp(left=current, op=node.op, right=node.value), node)
        code, t = self.scalar(value)
        return self.store(node.target, code, t, node)

    def unpack(self, node, target):
        if not isinstance(node.value, ast.Tuple) or len(node.value.elts) != len(target.elts):
            raise self.fail(node, "unpacking anything but a tuple of the same length")
        values = [self.scalar(v) for v in node.value.elts]
        temporaries, lines = [], []
        for code, t in values:
            temporary = self.fresh("mc_t")
            temporaries.append((temporary, t))
            lines.append(f"{t} {temporary} = {code};")
        for element, (temporary, t) in zip(target.elts, temporaries):
            lines += self.store(element, temporary, t, node)
        return ["{", *["    " + line for line in lines], "}"]

    def store(self, target, code, t, node) -> list:
        if isinstance(target, ast.Name):
            name = target.id
            if name in self.params or name in self.arrays:
                raise self.fail(node, f"rebinding the array {name!r}", "assign to its elements instead.")
            if name in self.constants:
                raise self.fail(node, f"assigning to the module constant {name!r}")
            self.assign_type(name, t, node)
            return [f"u_{name} = {code};"]
        if isinstance(target, ast.Subscript):
            element, et = self.expr(target)
            view = self.view_of(target.value)
            if view is not None and view.const:
                name = ast.unparse(target.value)
                raise AccessModeError(
                    f"kernel {self.kernel.name!r} at {self.kernel.where(node)} writes to {name!r}, an argument "
                    f"declared READ; declare it WRITE, RW or INC."
                )
            return [f"{element} = ({et})({code});"]
        raise self.fail(node, f"assigning to {ast.unparse(target)!r}")

    def assign_type(self, name, t, node) -> None:
        if isinstance(t, View):
            raise self.fail(node, f"binding the array expression to {name!r}", "index the array where it is used.")
        if name in self.arrays:
            raise self.fail(node, f"assigning a scalar to the local array {name!r}")
        old = self.locals.get(name)
        self.locals[name] = t if old is None or old == t else join(old, t)

    def allocate(self, name, call) -> list:
        ctype, shape, fill = _allocation(call, self.constants)
        if ctype is None:
            raise self.fail(call, f"the array allocation {ast.unparse(call)!r}",
                            "give a constant shape and a dtype of float64, float32, int32, int64, uint32 or uint64.")
        view = View(ctype, shape)
        if self.arrays.get(name, view) != view or name in self.locals or name in self.params:
            raise self.fail(call, f"giving {name!r} a second meaning (array of another shape or a scalar)")
        self.arrays[name] = view
        if fill is None:
            return []
        index = self.fresh("mc_k")
        return [f"for (int {index} = 0; {index} < {view.size}; ++{index}) u_{name}[{index}] = ({ctype}){fill};"]

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    # --- expressions --------------------------------------------------------------------------

    def scalar(self, node):
        code, t = self.expr(node)
        if isinstance(t, View):
            raise self.fail(node, f"using the array {ast.unparse(node)!r} as a value", "index it.")
        return code, t

    def integer(self, node) -> str:
        code, t = self.scalar(node)
        if t is not None and not is_int(t):
            raise self.fail(node, f"a non-integer range bound {ast.unparse(node)!r}")
        return f"(long long)({code})"

    def condition(self, node):
        """A test (if, while, conditional expression): ``and``/``or`` may take any values here."""
        outer, self.in_condition = self.in_condition, True
        try:
            return self.scalar(node)
        finally:
            self.in_condition = outer

    def expr(self, node, *, statement=False):
        method = getattr(self, f"ex_{type(node).__name__}", None)
        if method is None:
            raise self.fail(node, f"the expression {ast.unparse(node)!r} ({type(node).__name__})")
        if type(node).__name__ == "Call":
            return method(node, statement)
        return method(node)

    def ex_Constant(self, node):
        value = node.value
        if isinstance(value, (bool, int, float)):
            t = scalar_type(value)
            return literal(value, t), t
        raise self.fail(node, f"the constant {value!r}")

    def ex_Name(self, node):
        name = node.id
        if name in self.params:
            return f"u_{name}", self.params[name]
        if name in self.arrays:
            return f"u_{name}", self.arrays[name]
        if name in self.locals:
            return f"u_{name}", self.locals[name]
        if name in self.constants:
            return self.constant(node, self.constants[name])
        if name in ("True", "False"):
            return literal(name == "True", BOOL), BOOL
        if not self.emitting:
            return f"u_{name}", None  # assigned later in the text (inside a loop): known after this pass
        raise self.fail(node, f"the name {name!r}, used before it is assigned")

    def constant(self, node, constant):
        if constant.kind == "value":
            value = constant.value
            if isinstance(value, (tuple, np.ndarray)):
                return self.constant_array(node, constant.name, np.asarray(value))
            t = scalar_type(value)
            return literal(value, t), t
        raise self.fail(node, f"using {constant.name!r} ({constant.kind}) as a value")

    def constant_array(self, node, name, array):
        if array.dtype.kind not in "iuf" or array.size == 0:
            raise self.fail(node, f"the constant {name!r} of dtype {array.dtype}")
        ctype = DOUBLE if array.dtype.kind == "f" else INT
        symbol = f"mc_const_{self.kernel.name}_{name}"
        values = ", ".join(literal(v, ctype) for v in array.ravel().tolist())
        self.unit.constants.setdefault(symbol, f"__device__ const {ctype} {symbol}[{array.size}] = {{{values}}};")
        return symbol, View(ctype, array.shape, const=True)

    def ex_Attribute(self, node):
        module = self.module_of(node.value)
        if module in ("math", "numpy") and node.attr in _MATH_CONSTANTS:
            return literal(_MATH_CONSTANTS[node.attr], DOUBLE), DOUBLE
        if node.attr == "shape" and self.view_of(node.value) is not None:
            raise self.fail(node, "'.shape' as a value", "index it with a constant, e.g. a.shape[0].")
        raise self.fail(node, f"the attribute {ast.unparse(node)!r}")

    def ex_Subscript(self, node):
        if isinstance(node.value, ast.Attribute) and node.value.attr == "shape":
            view = self.view_of(node.value.value)
            axis = _constant_int(node.slice)
            if view is not None and axis is not None and -len(view.shape) <= axis < len(view.shape):
                return literal(view.shape[axis], INT), INT
        base, view = self.expr(node.value)
        if not isinstance(view, View):
            raise self.fail(node, f"indexing {ast.unparse(node.value)!r}, which is not an array")
        indices = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if len(indices) > len(view.shape):
            raise self.fail(node, f"{len(indices)} indices into an array of {len(view.shape)} dimensions")
        offset, stride = [], view.size
        for axis, index in enumerate(indices):
            if isinstance(index, ast.Slice):
                raise self.fail(node, f"the slice {ast.unparse(node)!r}", "index single elements.")
            stride //= view.shape[axis]
            offset.append(self.index(index, view.shape[axis], stride))
        flat = " + ".join(offset)
        rest = view.shape[len(indices):]
        if rest:
            return f"({base} + {flat})", View(view.ctype, rest, view.const)
        return f"{base}[{flat}]", view.ctype

    def index(self, node, extent: int, stride: int) -> str:
        constant = _constant_int(node)
        if constant is not None:
            if not -extent <= constant < extent:
                raise KernelError(
                    f"kernel {self.kernel.name!r} at {self.kernel.where(node)}: index {constant} is outside an "
                    f"array axis of length {extent}."
                )
            return str((constant % extent) * stride)
        code = self.integer(node)
        wrapped = f"mc_wrap({code}, {extent})"
        return wrapped if stride == 1 else f"{wrapped} * {stride}"

    def ex_UnaryOp(self, node):
        code, t = self.scalar(node.operand)
        if isinstance(node.op, ast.Not):
            return f"(!({code}))", BOOL
        if isinstance(node.op, ast.USub):
            return f"(-{code})", join(t, t)
        if isinstance(node.op, ast.UAdd):
            return f"(+{code})", join(t, t)
        if t is not None and not is_int(t):
            raise self.fail(node, "'~' on a float")
        return f"(~{code})", join(t, t)

    def ex_BinOp(self, node):
        left, lt = self.scalar(node.left)
        right, rt = self.scalar(node.right)
        t = join(lt, rt)
        op = type(node.op)
        if op in _BINARY:
            if op not in (ast.Add, ast.Sub, ast.Mult) and t is not None and not is_int(t):
                raise self.fail(node, f"the bitwise operator in {ast.unparse(node)!r} on floats")
            return f"({left} {_BINARY[op]} {right})", t
        if op is ast.Div:
            result = "float" if lt == rt == "float" else DOUBLE
            return f"(({result})({left}) / ({result})({right}))", result
        if op is ast.FloorDiv:
            return f"mc_floordiv(({t})({left}), ({t})({right}))", t
        if op is ast.Mod:
            return f"mc_mod(({t})({left}), ({t})({right}))", t
        if op is ast.Pow:
            if is_int(lt or INT) and is_int(rt or INT):
                return f"mc_ipow((long long)({left}), (long long)({right}))", INT
            result = "float" if lt == rt == "float" else DOUBLE
            return f"(({result})pow((double)({left}), (double)({right})))", result
        raise self.fail(node, f"the operator in {ast.unparse(node)!r}")

    def ex_BoolOp(self, node):
        op = " && " if isinstance(node.op, ast.And) else " || "
        operands = [self.scalar(v) for v in node.values]
        if not self.in_condition and any(t not in (None, BOOL) for _, t in operands):
            raise self.fail(node, f"'and'/'or' on numbers used as a value ({ast.unparse(node)!r})",
                            "compare explicitly, e.g. '(a != 0) and (b != 0)', or use a conditional expression.")
        return "(" + op.join(f"({code})" for code, _ in operands) + ")", BOOL

    def ex_Compare(self, node):
        parts, (left, lt) = [], self.scalar(node.left)
        for op, comparator in zip(node.ops, node.comparators):
            if type(op) not in _COMPARE:
                raise self.fail(node, f"the comparison {ast.unparse(node)!r}")
            right, rt = self.scalar(comparator)
            if is_unsigned(lt) or is_unsigned(rt):  # compared as NumPy promotes them, not as C converts them
                t = promote(lt, rt)
                parts.append(f"(({t})({left}) {_COMPARE[type(op)]} ({t})({right}))")
            else:
                parts.append(f"({left} {_COMPARE[type(op)]} {right})")
            left, lt = right, rt
        return "(" + " && ".join(parts) + ")", BOOL

    def ex_IfExp(self, node):
        test = self.condition(node.test)[0]
        body, bt = self.scalar(node.body)
        other, ot = self.scalar(node.orelse)
        t = bt if bt == ot else join(bt, ot)
        return f"(({test}) ? ({t})({body}) : ({t})({other}))", t

    def ex_Call(self, node, statement=False):
        if node.keywords and not _is_allocation_call(node):
            raise self.fail(node, f"keyword arguments in {ast.unparse(node)!r}")
        function = node.func
        if isinstance(function, ast.Name) and function.id in self.constants:
            constant = self.constants[function.id]
            if constant.kind == "function":
                return self.helper_call(node, constant, statement)
        name = self.function_name(function)
        if name is None:
            raise self.fail(node, f"the call {ast.unparse(node)!r}")
        if name == "print":
            raise self.fail(node, "print()", "remove it, or run with backend='reference' to debug.")
        if name == "len" and len(node.args) == 1:
            view = self.view_of(node.args[0])
            if view is None:
                raise self.fail(node, f"len() of the non-array {ast.unparse(node.args[0])!r}")
            return literal(view.shape[0], INT), INT
        args = [self.scalar(a) for a in node.args]
        return self.builtin(node, name, args)

    def function_name(self, function):
        """``'sqrt'`` for ``math.sqrt``/``np.sqrt``, ``'min'`` for the builtin, or None."""
        if isinstance(function, ast.Name) and function.id not in self.constants and function.id not in self.locals:
            return function.id
        if isinstance(function, ast.Attribute) and self.module_of(function.value) in ("math", "numpy"):
            name = _NUMPY_ALIASES.get(function.attr, function.attr)
            if self.module_of(function.value) == "math" and name in _ROUNDING:
                return f"math.{name}"
            return name
        return None

    def builtin(self, node, name, args):
        types_ = [t for _, t in args]
        codes = [c for c, _ in args]
        count = len(args)
        if name in _CASTS or name in ("float", "int", "bool"):
            target = _CASTS.get(name) or {"float": DOUBLE, "int": INT, "bool": BOOL}[name]
            if count != 1:
                raise self.fail(node, f"{name}() with {count} arguments")
            if target == BOOL:
                return f"(({codes[0]}) != 0)", BOOL
            return f"(({target})({codes[0]}))", target
        if name in _FLOAT_1 and count == 1:
            return f"{name}((double)({codes[0]}))", DOUBLE
        if name in _FLOAT_2 and count == 2:
            return f"{name}((double)({codes[0]}), (double)({codes[1]}))", DOUBLE
        if name in ("pow",) and count == 2:
            return self.ex_BinOp(ast.copy_location(ast.BinOp(node.args[0], ast.Pow(), node.args[1]), node))
        if name in _PREDICATES and count == 1:
            return f"{name}((double)({codes[0]}))", BOOL
        if name in _ROUNDING and count == 1:
            return f"{name}((double)({codes[0]}))", DOUBLE
        if name.startswith("math.") and count == 1:
            return f"((long long){name[5:]}((double)({codes[0]})))", INT
        if name == "round" and count == 1:
            return f"((long long)rint((double)({codes[0]})))", INT
        if name == "abs" and count == 1 and is_unsigned(types_[0]):
            return codes[0], types_[0]
        if name == "abs" and count == 1:
            t = join(types_[0], types_[0])
            return (f"fabs((double)({codes[0]}))", DOUBLE) if is_float(t) and t == DOUBLE else (f"mc_abs(({t})({codes[0]}))", t)
        if name in ("min", "max") and count >= 2:
            t = types_[0]
            for other in types_[1:]:
                t = promote(t, other)
            code = f"({t})({codes[0]})"
            for c in codes[1:]:
                code = f"mc_{name}({code}, ({t})({c}))"
            return code, t
        raise self.fail(node, f"the function call {ast.unparse(node)!r}",
                        "kernels may call math/numpy functions, min, max, abs, round, casts and helper functions.")

    def helper_call(self, node, constant, statement):
        helper = constant.helper
        args = [self.expr(a) for a in node.args]
        if any(t is None for _, t in args):
            return "0", None  # argument types are not known yet (first pass)
        key = (helper, tuple(t for _, t in args))
        if helper in self.stack:
            raise self.fail(node, f"the recursive call of {constant.name!r}")
        if key not in self.unit.helpers:
            name = f"mc_helper_{helper.name}_{len(self.unit.helpers)}"
            translator = _FunctionTranslator(helper, [t for _, t in args], self.unit, name,
                                             stack=self.stack + (self.kernel,), returns=True)
            self.unit.helpers[key] = (name, translator.run())
        name, result = self.unit.helpers[key]
        if result == "void" and not statement:
            raise self.fail(node, f"using the result of {constant.name!r}, which returns nothing")
        return f"{name}({', '.join(c for c, _ in args)})", (None if result == "void" else result)

    def module_of(self, node):
        if isinstance(node, ast.Name) and node.id in self.constants:
            constant = self.constants[node.id]
            if constant.kind == "module":
                return constant.value.__name__
        return None

    def view_of(self, node):
        try:
            _, t = self.expr(node)
        except KernelError:
            return None
        return t if isinstance(t, View) else None


def _as_load(node):
    """``node`` (an assignment target) as an expression that reads it."""
    copy = ast.parse(ast.unparse(node), mode="eval").body
    for part in ast.walk(copy):
        ast.copy_location(part, node)  # errors inside name the statement's line
    return copy


def _constant_int(node):
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _constant_int(node.operand)
        return None if inner is None else -inner
    return None


def _constant_sign(node):
    value = _constant_int(node)
    return None if value in (None, 0) else (1 if value > 0 else -1)


def _is_allocation_call(node) -> bool:
    return isinstance(node.func, ast.Attribute) and node.func.attr in _ALLOCATORS


def _allocation(call, constants):
    """``(ctype, shape, fill)`` for ``np.zeros(shape, dtype)`` and friends; ``(None, ...)`` for an
    allocation that cannot be translated; None when ``call`` is not an allocation."""
    if not (isinstance(call, ast.Call) and _is_allocation_call(call)):
        return None
    module = call.func.value
    if not (isinstance(module, ast.Name) and module.id in constants and constants[module.id].kind == "module"
            and isinstance(constants[module.id].value, types.ModuleType)
            and constants[module.id].value.__name__ == "numpy"):
        return None
    fill = _ALLOCATORS[call.func.attr]
    dtype_node = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "dtype"), None)
    shape_node = call.args[0] if call.args else None
    shape = _constant_shape(shape_node, constants)
    ctype = _dtype_of(dtype_node, constants)
    if shape is None or ctype is None or len(call.args) > 2 or any(k.arg != "dtype" for k in call.keywords):
        return None, None, None
    return ctype, shape, fill


def _constant_shape(node, constants):
    if node is None:
        return None
    if isinstance(node, ast.Tuple):
        dims = [_constant_shape(e, constants) for e in node.elts]
        return None if any(d is None or len(d) != 1 for d in dims) else tuple(d[0] for d in dims)
    value = _constant_int(node)
    if value is None and isinstance(node, ast.Name) and node.id in constants:
        candidate = constants[node.id].value
        value = int(candidate) if isinstance(candidate, (int, np.integer)) and not isinstance(candidate, bool) else None
    return (value,) if value is not None and value > 0 else None


def _dtype_of(node, constants):
    if node is None:
        return DOUBLE
    if isinstance(node, ast.Name) and node.id in ("float", "int"):
        return DOUBLE if node.id == "float" else INT
    if isinstance(node, ast.Attribute) and node.attr in ("float64", "float32", "int32", "int64", "uint32", "uint64"):
        return c_type(node.attr)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            return c_type(node.value)
        except TypeError:
            return None
    return None
