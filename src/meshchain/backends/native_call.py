"""Compiled functions called by address from other compiled functions.

When a Numba function calls another one by name, Numba links the callee's code into the
caller's and LLVM optimises and emits all of it again: a chain phase of four Airfoil loops
took 1.7 s to compile although each loop was already compiled (the loops themselves, 2.5 s).
:func:`call_native` calls a compiled function at an address given as data instead, through
Numba's own calling convention (so an exception the callee raises reaches the caller's
caller as usual): the caller compiles in a fraction of the time, whatever the callees, and
as the address is an argument, not a constant in the machine code, Numba's disk cache keeps
the caller like any other function.

:func:`call_native_with` does the same with the arguments in one tuple: a caller that holds them
as a tuple (a captured step's compiled replay, :mod:`.numba_replay`) passes it whole, which
compiles faster than taking each element out (each a typed and reference-counted operation).

:func:`native_address` gives the address of a dispatcher's compiled overload and the text
:func:`call_native` checks the call's argument types against: a call whose arguments are not
of exactly the types the callee was compiled for fails to compile (it would read its
arguments wrongly), it never runs.

Examples
--------
>>> import numba
>>> import numpy as np
>>> @numba.njit
... def twice_into(out, x):
...     out[0] = 2 * x
>>> out = np.zeros(1)
>>> address, signature = native_address(twice_into, (out, 3.5))
>>> @numba.njit
... def caller(address, out):
...     call_native(address, "(Array(float64, 1, 'C', False, aligned=True), float64)", out, 3.5)
>>> signature
"(Array(float64, 1, 'C', False, aligned=True), float64)"
>>> caller(address, out)
>>> float(out[0])
7.0
"""

from __future__ import annotations

import numba
from numba.core import cgutils, errors, types
from numba.extending import intrinsic

from ..core.errors import InternalError

__all__ = ["call_native", "call_native_with", "native_address", "signature_text"]


def signature_text(kinds) -> str:
    """The text :func:`call_native` compares its arguments' Numba types with."""
    return str(tuple(kinds))


def native_address(dispatcher, arguments) -> tuple[int, str]:
    """``(address, signature text)`` of ``dispatcher``'s overload for ``arguments``' types
    (compiled, or loaded from the disk cache, if it is not yet): a function returning None,
    whose address stays valid as long as the dispatcher lives."""
    kinds = tuple(numba.typeof(a) for a in arguments)
    result = dispatcher.overloads.get(kinds)
    if result is None:
        dispatcher.compile(kinds)
        result = dispatcher.overloads[kinds]
    if result.signature.return_type != types.none:
        raise InternalError(f"call_native calls functions that return None, not {result.signature}")
    return result.library.get_pointer_to_function(result.fndesc.llvm_func_name), signature_text(kinds)


@intrinsic
def call_native(typingctx, address, signature, *arguments):
    """``f(*arguments)`` for the Numba function ``f`` compiled at ``address`` (an integer,
    from :func:`native_address`) for exactly the argument types ``signature`` (a literal
    string, :func:`signature_text`) names; an exception ``f`` raises propagates."""
    if not isinstance(signature, types.StringLiteral):
        return None  # Numba asks again with the string as a literal
    given = tuple(arguments)
    return types.none(address, signature, types.StarArgTuple(given)), _codegen("call_native", signature, given)


@intrinsic
def call_native_with(typingctx, address, signature, arguments):
    """:func:`call_native` with ``arguments`` in one tuple (passed on element by element as
    the tuple holds them: the callee borrows them, as from any caller).

    >>> import numba
    >>> import numpy as np
    >>> @numba.njit
    ... def add(total, values):
    ...     for v in values:
    ...         total[0] += v
    >>> total, values = np.zeros(1, dtype=np.int64), np.arange(4)
    >>> address, signature = native_address(add, (total, values))
    >>> run = numba.njit(lambda address, arguments: call_native_with(address, signature, arguments))
    >>> run(address, (total, values)); run(address, (total, values))
    >>> int(total[0])
    12
    """
    if not isinstance(signature, types.StringLiteral):
        return None  # Numba asks again with the string as a literal
    if not isinstance(arguments, types.BaseTuple):
        raise errors.TypingError(f"call_native_with: the arguments must be a tuple, not {arguments}")
    return types.none(address, signature, arguments), _codegen("call_native_with", signature, tuple(arguments))


def _codegen(name: str, signature, given):
    """The code calling the function at the address with the tuple of arguments of types
    ``given`` (checked against ``signature``: a call of other types fails to compile)."""
    kinds = tuple(types.unliteral(kind) for kind in given)  # a constant argument: its type's value
    if signature_text(kinds) != signature.literal_value:
        raise errors.TypingError(f"{name}: the arguments are {signature_text(kinds)}, but the function at the "
                                 f"address was compiled for {signature.literal_value}")

    def codegen(context, builder, call_signature, args):
        values = [context.cast(builder, value, kind, wanted) for value, kind, wanted in
                  zip(cgutils.unpack_tuple(builder, args[2], len(kinds)), given, kinds)]
        _call(context, builder, args[0], call_signature.args[0], kinds, values)
        return context.get_dummy_value()

    return codegen


def _call(context, builder, address, address_type, kinds, values) -> None:
    """Call the function at ``address`` with ``values`` of types ``kinds``; its error propagates."""
    function_type = context.call_conv.get_function_type(types.none, kinds)
    where = context.cast(builder, address, address_type, types.intp)
    function = builder.inttoptr(where, function_type.as_pointer())
    status, _ = context.call_conv.call_function(builder, function, types.none, kinds, values)
    with cgutils.if_unlikely(builder, status.is_error):
        context.call_conv.return_status_propagate(builder, status)
