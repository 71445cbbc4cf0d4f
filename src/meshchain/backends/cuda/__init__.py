"""The CUDA backend: kernels translated to CUDA C, run on a GPU through CuPy or in a host
emulation (``backend="cupy"`` / ``backend="cuda-emulation"``); see :mod:`.backend`."""
