"""``meshchain.core.arrays.unique_integers``: ``np.unique``'s result for integer arrays, by a
mark over the values' span where it is short and by sorting where not."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from meshchain.core.arrays import unique_integers
from meshchain.core.errors import InternalError

DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint32, np.uint64]


@settings(max_examples=300, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(DTYPES), shape=hnp.array_shapes(min_dims=1, max_dims=2, min_side=0,
                                                                                max_side=60))
def test_unique_integers_is_numpys_unique(data, dtype, shape):
    """Values over the dtype's whole range (spans too long to mark) or near one value (short
    ones), with their extremes; the distinct values, their dtype and the inverse as NumPy's."""
    info = np.iinfo(dtype)
    if data.draw(st.booleans()):
        elements = st.integers(int(info.min), int(info.max))
    else:
        centre = data.draw(st.integers(int(info.min), int(info.max)))
        elements = st.integers(max(int(info.min), centre - 50), min(int(info.max), centre + 50))
    values = data.draw(hnp.arrays(dtype, shape, elements=elements))
    want, want_inverse = np.unique(values, return_inverse=True)
    got = unique_integers(values)
    assert got.dtype == want.dtype and np.array_equal(got, want)
    got, inverse = unique_integers(values, return_inverse=True)
    assert np.array_equal(got, want) and np.array_equal(inverse, want_inverse.ravel())
    assert np.array_equal(got[inverse], values.ravel())


def test_unique_integers_refuses_other_dtypes():
    with pytest.raises(InternalError, match="an integer array"):
        unique_integers(np.array([1.0, 2.0]))
