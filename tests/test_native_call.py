"""Compiled functions called by address (``backends/native_call.py``): the callee's results and
exceptions reach the caller, and a call with other argument types than the callee's is
refused when the caller compiles, before anything runs."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from meshchain.backends.native_call import call_native, native_address
from meshchain.core.errors import InternalError


@numba.njit
def scaled_into(out, x, factor, count):
    if count < 0:
        raise ValueError("count must be >= 0")
    for i in range(count):
        out[i] = factor * x[i]


@numba.njit
def twice(value):
    return 2 * value


def test_a_call_by_address_runs_the_callee_and_passes_its_exception_on():
    out, x = np.zeros(4), np.arange(4.0)
    address, signature = native_address(scaled_into, (out, x, 1.5, 3))

    @numba.njit
    def caller(address, out, x, count):
        call_native(address, signature, out, x, 1.5, count)  # 1.5: a constant, passed as float64

    caller(address, out, x, 3)
    np.testing.assert_array_equal(out, [0.0, 1.5, 3.0, 0.0])
    with pytest.raises(ValueError, match="count must be >= 0"):
        caller(address, out, x, -1)


def test_arguments_of_other_types_than_the_callees_are_refused_at_compile_time():
    out, x = np.zeros(4), np.arange(4.0)
    address, signature = native_address(scaled_into, (out, x, 1.5, 3))

    @numba.njit
    def caller(address, out, x):
        call_native(address, signature, out, x, 1.5, 3)

    with pytest.raises(numba.core.errors.TypingError, match="compiled for"):
        caller(address, out, x.astype(np.float32))  # float32 data: the callee would read it as float64
    np.testing.assert_array_equal(out, 0.0)


def test_only_functions_returning_none_are_called_by_address():
    with pytest.raises(InternalError, match="return None"):
        native_address(twice, (1,))
