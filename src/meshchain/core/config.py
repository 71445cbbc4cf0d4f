"""Configuration: ``mc.configure(...)`` and ``MESHCHAIN_*`` environment variables.

Examples
--------
>>> from meshchain.core.config import Config
>>> Config.from_env({"MESHCHAIN_BACKEND": "reference"}).backend
'reference'
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigurationError, MeshchainWarning

__all__ = ["Config", "BACKENDS", "TRANSPORTS", "PROGRESS", "INTERIOR", "BOUNDARY", "HANG_ACTIONS", "AUXILIARY_VARIABLES"]

AUXILIARY_VARIABLES = frozenset({
    # set by meshchain's own test harness (meshchain.testing, tests/conftest.py) and notebook
    "MESHCHAIN_MPI_CHILD", "MESHCHAIN_MPI_NPROCS", "MESHCHAIN_MPI_NODEID", "MESHCHAIN_MPI_RESULTS",
    "MESHCHAIN_MPI_WALL_SLACK", "MESHCHAIN_TEST_CACHE_DIR", "MESHCHAIN_NOTEBOOK_SMALL",
})

BACKENDS = ("numba", "reference", "cupy", "cuda-emulation")
GPU_INCREMENTS = ("atomic", "colour")
GPU_HALOS = ("auto", "staged", "direct")
TRANSPORTS = ("auto", "p2p", "persistent", "neighbour", "rma")
PROGRESS = ("auto", "none", "poll", "thread")
INTERIOR = ("static", "dynamic")
BOUNDARY = ("bulk", "tasks")
HANG_ACTIONS = ("report", "abort")


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "meshchain"


@dataclass(frozen=True)
class Config:
    """All run-time options. Every field can also be set by ``MESHCHAIN_<FIELD>``.

    Attributes
    ----------
    backend : str
        ``"numba"`` (default), ``"reference"`` (the NumPy/Python oracle), ``"cupy"`` (NVIDIA
        GPUs) or ``"cuda-emulation"`` (the cupy backend's CUDA source run on the CPU: slow,
        for testing GPU code paths without a GPU).
    threads : int or None
        Threads for the numba backend; ``None`` uses all of Numba's threads on one process and,
        under MPI, an equal share of them per rank on the node (ranks never oversubscribe).
    cache_dir : Path
        Where generated code and compiled objects are kept (reused by later processes).
    block_size : int
        Iterations per block: blocks are coloured and run by threads; the same for any
        thread count, so results are bit-identical whatever ``threads`` is.
    trace_length : int
        Pending loops that make the trace run (default 256); 1 runs every loop at once.
    debug : bool
        Bounds-check every kernel in compiled backends.
    fp_contract : bool
        Let the numba backend fuse a multiply and an add of a kernel into one fused multiply-add
        (Numba's ``fastmath={"contract"}``, what C compilers do with ``-ffp-contract=fast``; the
        other fast-math licences, such as assuming no NaN, are not taken). Default False: the
        generated loops give the reference path's bits. True: faster arithmetic-bound kernels
        (a five-point stencil 1.17x here, ``benchmarks/jacobi.py``) whose results differ from the
        reference in the last bits; they are the same for any thread count, and loop by loop or
        communication-avoiding (every path runs the same compiled loop). Needs a
        compiling backend: the reference backend refuses it. The GPU backends follow it too:
        NVRTC's ``--fmad=true`` or ``false`` (its own default is true), so that by default a
        GPU rounds each operation as the CPU does.
    overlap : bool
        On several ranks, run a loop's core iterations while its halo exchanges are in
        flight (default); False waits for the exchanges first (exchange-then-compute, the
        reference for measurements; it also turns ``eager`` off).
    eager : bool
        Boundary-first, eager sends (default): where the next step of a plan exchanges dats
        the step before it writes, that step runs first the iterations that write rows other
        ranks import, posts the exchange, and runs its interior while the messages travel.
    progress : str
        What moves messages while a rank computes: ``"none"`` (MPI, inside its calls only),
        ``"poll"`` (a communication thread tests the requests in flight while compiled code
        runs without the GIL), ``"thread"`` (MPICH's asynchronous progress thread; it must
        be switched on before MPI starts: ``MESHCHAIN_PROGRESS=thread`` in the environment)
        or ``"auto"`` (default: ``"none"``; ``mc.model.calibrate(apply=True)`` switches to
        the mode it measured fastest). ``mc.stats().progress`` says which one runs. The GPU
        backends take ``"none"`` and ``"thread"`` (their kernels run while the host drives
        the messages); an applied calibration chooses among those.
    interior : str
        How the iterations that overlap messages are run: ``"static"`` (one compiled call,
        blocks of a colour on Numba's threads; default) or ``"dynamic"`` (blocks handed out
        in chunks to ``threads`` threads; the thread that drives communication joins once its
        messages are complete; numba backend). Both give the same bits.
    boundary : str
        How the iterations that need received halos run once the core is done: ``"bulk"``
        (default: wait for every message, then run them all) or ``"tasks"`` (grouped by the
        neighbours whose messages they need, each group run as soon as those messages have
        arrived, in the order they arrive; transports ``"persistent"`` and ``"p2p"``; sums
        over a row incremented from several groups may round differently from ``"bulk"``).
    chains : Path or None
        A TOML file naming loop chains by their loops (see :mod:`meshchain.engine.chains`).
    gpu_threads : int
        Threads per CUDA block (a power of two, at most 1024; default 256).
    gpu_increments : str
        How CUDA loops increment data through maps: ``"atomic"`` (``atomicAdd``, default)
        or ``"colour"`` (iterations coloured so that one launch never increments an
        element twice; plain adds, one launch per colour).
    gpu_halos : str
        How CUDA backends hand halo bytes to MPI on several ranks: ``"staged"`` (one copy
        of each exchange's packed bytes through pinned host buffers), ``"direct"`` (the
        device buffers themselves; needs a CUDA-aware MPI) or ``"auto"`` (default: direct
        when the MPI library reports CUDA support, else staged).
    transport : str
        How halo exchanges move their messages on several ranks (every transport gives the
        same bits): ``"p2p"`` (``Isend``/``Irecv`` each time), ``"persistent"`` (persistent
        requests made once per exchange plan, started each time), ``"neighbour"``
        (``Ineighbor_alltoallv`` on a distributed-graph communicator), ``"rma"`` (a window
        per plan, ``Put`` with active-target synchronisation) or ``"auto"`` (default:
        ``"persistent"``; ``mc.model.calibrate(apply=True)`` switches to the one it measured
        fastest). ``mc.stats().transport`` says which one runs.
    profile : Path or None
        Write a Chrome trace-event file (Perfetto and ``chrome://tracing`` read it) of
        everything the session runs to this path when the process exits (``{rank}`` in the
        name is replaced by the rank; otherwise rank 0 writes one file with every rank's
        events); ``mc.profile(path)`` does the same for a block of code.
    hang_timeout : float or None
        Seconds a rank may wait in a halo exchange, a reduction or a collective (or run one
        loop) before it prints, once, what it is in, which neighbours' messages are
        outstanding and every thread's stack (default None: never).
    hang_action : str
        What a rank does once it has reported a hang: ``"report"`` (default: keep waiting)
        or ``"abort"`` (abort every rank of the job).
    """

    backend: str = "numba"
    threads: int | None = None
    cache_dir: Path = dataclasses.field(default_factory=_default_cache_dir)
    block_size: int = 2048
    trace_length: int = 256
    debug: bool = False
    fp_contract: bool = False
    overlap: bool = True
    chains: Path | None = None
    gpu_threads: int = 256
    gpu_increments: str = "atomic"
    gpu_halos: str = "auto"
    transport: str = "auto"
    eager: bool = True
    progress: str = "auto"
    interior: str = "static"
    boundary: str = "bulk"
    profile: Path | None = None
    hang_timeout: float | None = None
    hang_action: str = "report"

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ConfigurationError(f"backend {self.backend!r} is unknown; choose one of {', '.join(BACKENDS)}.")
        for field, low in (("block_size", 1), ("trace_length", 1)):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigurationError(f"{field} must be an integer >= {low}, got {value!r}.")
        if self.threads is not None and (isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1):
            raise ConfigurationError(f"threads must be a positive integer or None, got {self.threads!r}.")
        threads = self.gpu_threads
        if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 1024 or threads & (threads - 1):
            raise ConfigurationError(f"gpu_threads must be a power of two from 1 to 1024, got {threads!r}.")
        if self.gpu_increments not in GPU_INCREMENTS:
            raise ConfigurationError(
                f"gpu_increments must be one of {', '.join(GPU_INCREMENTS)}, got {self.gpu_increments!r}."
            )
        if self.transport not in TRANSPORTS:
            raise ConfigurationError(f"transport {self.transport!r} is unknown; choose one of {', '.join(TRANSPORTS)}.")
        if self.progress not in PROGRESS:
            raise ConfigurationError(f"progress {self.progress!r} is unknown; choose one of {', '.join(PROGRESS)}.")
        if self.interior not in INTERIOR:
            raise ConfigurationError(f"interior {self.interior!r} is unknown; choose one of {', '.join(INTERIOR)}.")
        if self.boundary not in BOUNDARY:
            raise ConfigurationError(f"boundary {self.boundary!r} is unknown; choose one of {', '.join(BOUNDARY)}.")
        if self.gpu_halos not in GPU_HALOS:
            raise ConfigurationError(f"gpu_halos must be one of {', '.join(GPU_HALOS)}, got {self.gpu_halos!r}.")
        for flag in ("debug", "overlap", "eager", "fp_contract"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigurationError(f"{flag} must be True or False, got {getattr(self, flag)!r}.")
        if self.fp_contract and self.backend == "reference":
            raise ConfigurationError("fp_contract=True needs a compiling backend: the reference backend computes each "
                                     "operation in NumPy and fuses nothing; use backend='numba'.")
        if self.hang_action not in HANG_ACTIONS:
            raise ConfigurationError(f"hang_action must be one of {', '.join(HANG_ACTIONS)}, got {self.hang_action!r}.")
        timeout = self.hang_timeout
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not timeout > 0 or timeout == float("inf")):
            raise ConfigurationError(f"hang_timeout must be a positive number of seconds or None, got {timeout!r}.")
        object.__setattr__(self, "cache_dir", Path(self.cache_dir))
        if self.profile is not None:
            if not isinstance(self.profile, (str, os.PathLike)) or not str(self.profile):
                raise ConfigurationError(f"profile must be a file path or None, got {self.profile!r}.")
            object.__setattr__(self, "profile", Path(self.profile))
        if self.chains is not None:
            object.__setattr__(self, "chains", Path(self.chains))

    def replace(self, **options) -> "Config":
        """A copy with ``options`` changed; unknown option names raise ConfigurationError."""
        unknown = set(options) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigurationError(
                f"unknown option(s) {', '.join(sorted(unknown))}; valid: {', '.join(f.name for f in dataclasses.fields(self))}."
            )
        return dataclasses.replace(self, **options)

    @classmethod
    def from_env(cls, environ=None) -> "Config":
        """Read ``MESHCHAIN_BACKEND``, ``_THREADS``, ``_CACHE_DIR``, ``_BLOCK_SIZE``, ``_TRACE_LENGTH``,
        ``_DEBUG``, ``_OVERLAP``, ``_CHAINS``, ``_GPU_THREADS``, ``_GPU_INCREMENTS``, ``_GPU_HALOS``,
        ``_TRANSPORT``, ``_EAGER``, ``_PROGRESS``, ``_INTERIOR``, ``_BOUNDARY``, ``_PROFILE``, ``_HANG_TIMEOUT``,
        ``_HANG_ACTION``."""
        environ = os.environ if environ is None else environ
        options = {}
        for field in dataclasses.fields(cls):
            raw = environ.get(f"MESHCHAIN_{field.name.upper()}")
            if raw is not None:
                options[field.name] = _parse(field.name, raw)
        _warn_unknown(environ, [f"MESHCHAIN_{f.name.upper()}" for f in dataclasses.fields(cls)])
        return cls(**options)


def _warn_unknown(environ, known) -> None:
    """A :class:`MeshchainWarning` for each ``MESHCHAIN_*`` variable that is no option (a
    misspelt option would otherwise be ignored without a word)."""
    for name in sorted(environ):
        if name.startswith("MESHCHAIN_") and name not in known and name not in AUXILIARY_VARIABLES:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
            hint = f"did you mean {close[0]}? " if close else ""
            warnings.warn(MeshchainWarning(
                f"[unknown-option] environment variable {name} is not a meshchain option and is ignored; {hint}"
                f"options: {', '.join(known)}."), stacklevel=3)


def _parse(name: str, raw: str):
    if name in ("backend", "cache_dir", "gpu_increments", "gpu_halos", "transport", "progress", "interior",
                "boundary", "hang_action"):
        return raw
    if name in ("chains", "profile"):
        return raw or None
    if name == "hang_timeout":
        if raw.lower() in ("", "none", "off"):
            return None
        try:
            return float(raw)
        except ValueError:
            raise ConfigurationError(f"MESHCHAIN_HANG_TIMEOUT={raw!r} is not a number of seconds.") from None
    if name in ("debug", "overlap", "eager", "fp_contract"):
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off", ""):
            return False
        raise ConfigurationError(f"MESHCHAIN_{name.upper()}={raw!r}: use 1 or 0.")
    if name == "threads" and raw.lower() in ("", "none", "all"):
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigurationError(f"MESHCHAIN_{name.upper()}={raw!r} is not an integer.") from None
