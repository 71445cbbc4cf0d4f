"""Halo packing on the device (:mod:`meshchain.backends.cuda.halo`): the pack/unpack kernel
against NumPy and the copy stream, in the host emulation and, where a GPU is present, on
it; the emulated copy stream's ordering, the choice between staged and direct halos, and
the kernel compiled by nvcc. The exchanges themselves run on several ranks in
``test_cuda_mpi.py``."""

from __future__ import annotations


import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import meshchain as mc
from meshchain.backends.cuda.device import CupyDevice, EmulatedDevice
from meshchain.backends.cuda.halo import HALO_SOURCE, HALO_THREADS, halo_mode, mpi_is_cuda_aware
from meshchain.core.config import Config

from devices import DEVICE_BACKENDS, needs_a_device, needs_gxx
from test_cuda import _nvcc, needs_nvcc

pytestmark = needs_a_device

DTYPES = st.sampled_from([np.float64, np.float32, np.int64, np.int32, np.int16, np.int8])


@st.composite
def dats_and_rows(draw):
    """Random arrays (row sizes of 1 to 32 bytes, so every copy width is used) and, per array,
    the rows an exchange moves, in any order."""
    arrays, picks = [], []
    for _ in range(draw(st.integers(1, 4))):
        dtype = draw(DTYPES)
        n, dim = draw(st.integers(1, 40)), draw(st.integers(1, 4))
        arrays.append(np.arange(n * dim, dtype=np.int64).astype(dtype).reshape(n, dim) + len(arrays))
        picks.append(np.array(draw(st.lists(st.integers(0, n - 1), max_size=30)), dtype=np.int64))
    return arrays, picks


def describe(arrays, picks) -> tuple[np.ndarray, int]:
    """The kernel's row descriptors (dat, row, bytes, offset), rows packed array after array."""
    rows, offset = [], 0
    for number, (array, picked) in enumerate(zip(arrays, picks)):
        size = array[0].nbytes
        for row in picked:
            rows.append((number, row, size, offset))
            offset += size
    return np.array(rows, dtype=np.int64).reshape(-1, 4), offset


DEVICES = {"cuda-emulation": EmulatedDevice, "cupy": CupyDevice}


@pytest.fixture(scope="module", params=DEVICE_BACKENDS)
def device(request, tmp_path_factory):
    """A device of each kind present, and the halo kernel compiled for it."""
    made = DEVICES[request.param](tmp_path_factory.mktemp("halo"))
    return made, made.compile(HALO_SOURCE, "the halo packing kernel")


def launch(device, kernel, rows, arrays, buffer, *, pack: bool):
    """Run the kernel on device copies of ``arrays`` and ``buffer``; return both, on the host."""
    on_device = [device.upload(a) for a in arrays]
    packed = device.upload(buffer)
    bases = device.upload(np.array([device.address(a) for a in on_device], dtype=np.uint64))
    grid = max((len(rows) + HALO_THREADS - 1) // HALO_THREADS, 1)
    device.launch(kernel, grid, HALO_THREADS,
                  [len(rows), bases, device.upload(rows), packed, np.int32(1 if pack else 0)])
    return [device.to_host(a) for a in on_device], device.to_host(packed)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(case=dats_and_rows())
def test_halo_kernel_packs_and_unpacks_rows_like_numpy(device, case):
    device, kernel = device
    arrays, picks = case
    rows, nbytes = describe(arrays, picks)
    _, buffer = launch(device, kernel, rows, arrays, np.zeros(nbytes, dtype=np.uint8), pack=True)
    expected = b"".join(a[p].tobytes() for a, p in zip(arrays, picks))
    assert buffer.tobytes() == expected

    targets, _ = launch(device, kernel, rows, [np.full_like(a, -7) for a in arrays], buffer, pack=False)
    for array, target, picked in zip(arrays, targets, picks):
        untouched = np.setdiff1d(np.arange(len(array)), picked)
        np.testing.assert_array_equal(target[picked], array[picked])
        assert (target[untouched] == -7).all()


def test_the_halo_kernel_copies_misaligned_rows_byte_by_byte(device):
    device, kernel = device
    bytes3 = np.arange(30, dtype=np.int8).reshape(10, 3)  # 3-byte rows: offsets 0, 3, 6, ...
    words = np.arange(20, dtype=np.int32).reshape(10, 2)  # 8-byte rows, placed at odd offsets
    picks = [np.array([9, 0, 4]), np.array([1, 7])]
    rows, nbytes = describe([bytes3, words], picks)
    assert rows[3, 3] % 2 == 1  # the int32 rows start at an odd byte offset
    _, buffer = launch(device, kernel, rows, [bytes3, words], np.zeros(nbytes, dtype=np.uint8), pack=True)
    assert buffer.tobytes() == bytes3[picks[0]].tobytes() + words[picks[1]].tobytes()


def test_the_copy_stream_moves_bytes_both_ways_in_order(device):
    """A staged copy out waits for the compute work before it; a copy in comes before the
    compute work after it: the round trip through pinned host buffers keeps every byte."""
    device, _ = device
    source = np.arange(1 << 16, dtype=np.uint8) * np.uint8(7)
    on_device = device.upload(source)
    staged = device.pinned(source.nbytes)
    device.wait(device.copy_out(device.mark(), on_device, staged))
    assert staged.tobytes() == source.tobytes()
    back = device.empty(source.shape, np.uint8)
    staged[:] = source[::-1]
    device.copy_in(staged, back)
    device.settle()
    assert device.to_host(back).tobytes() == source[::-1].tobytes()


@needs_gxx
def test_the_emulated_copy_stream_holds_copies_until_the_host_waits(tmp_path):
    device = EmulatedDevice(tmp_path)
    source, target = np.arange(8, dtype=np.uint8), np.zeros(8, dtype=np.uint8)
    first = device.copy_out(device.mark(), source, target)
    second = device.copy_out(device.mark(), source[::-1].copy(), np.zeros(8, dtype=np.uint8))
    assert not target.any()  # not yet: a staged send must wait for its copy
    device.wait(first)
    np.testing.assert_array_equal(target, source)
    assert first.done and not second.done
    device_side = np.zeros(8, dtype=np.uint8)
    device.copy_in(source, device_side)  # compute work after it sees the bytes, so it is done
    np.testing.assert_array_equal(device_side, source)
    assert second.done  # the stream runs in order


class FakeGpu:
    host_memory = False

    def __init__(self, aware):
        self.aware_mpi = aware


@needs_gxx
def test_halo_mode_follows_the_setting_and_what_mpi_supports(tmp_path):
    assert halo_mode("staged", FakeGpu(True)) is True
    assert halo_mode("auto", FakeGpu(True)) is False
    assert halo_mode("auto", FakeGpu(False)) is True
    assert halo_mode("direct", FakeGpu(True)) is False
    with pytest.raises(mc.ConfigurationError, match="CUDA-aware MPI"):
        halo_mode("direct", FakeGpu(False))
    unknown = FakeGpu(None)
    assert halo_mode("auto", unknown) is (not mpi_is_cuda_aware())
    assert unknown.aware_mpi is mpi_is_cuda_aware()  # asked once, then remembered
    emulated = EmulatedDevice(tmp_path)
    assert halo_mode("auto", emulated) is True and halo_mode("direct", emulated) is False


def test_the_mpich_wheel_is_not_cuda_aware():
    from mpi4py import MPI

    if "cuda" in MPI.Get_library_version().lower():
        pytest.skip("this MPI library was configured with CUDA")
    assert mpi_is_cuda_aware() is False


def test_gpu_halos_is_validated_and_read_from_the_environment():
    with pytest.raises(mc.ConfigurationError, match="gpu_halos"):
        mc.configure(gpu_halos="pinned")
    assert Config.from_env({"MESHCHAIN_GPU_HALOS": "direct"}).gpu_halos == "direct"
    assert Config().gpu_halos == "auto"


@needs_nvcc
def test_the_halo_kernel_compiles_with_nvcc(tmp_path):
    _nvcc(tmp_path, HALO_SOURCE, "halo")


def test_direct_halos_without_cuda_aware_mpi_fail_when_the_backend_is_made():
    from meshchain.backends.cuda.backend import CudaBackend

    class Gpu(FakeGpu):
        name = "cupy"

        def upload(self, host):
            return np.array(host)

    from meshchain.core.cache import CacheRegistry

    def on_ranks(halos, gpu):  # the backend as a session on several ranks makes it
        return CudaBackend(Config(gpu_halos=halos), CacheRegistry(), distributed=True, device=gpu)

    with pytest.raises(mc.ConfigurationError, match="gpu_halos='direct' needs a CUDA-aware MPI"):
        on_ranks("direct", Gpu(False))
    assert on_ranks("direct", Gpu(True)).name == "cupy"
    assert on_ranks("auto", Gpu(False)).name == "cupy"
