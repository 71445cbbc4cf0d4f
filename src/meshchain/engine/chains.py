"""Loop chains: the options of ``with mc.loop_chain(...)`` blocks and chains named in a TOML file.

A chain groups consecutive loops so that the runtime can execute them together: on
several ranks with one grouped halo exchange (communication avoidance, ``ca=True``),
or loop by loop (``ca=False``), or as the model decides (``ca="auto"``).

The configuration file (``MESHCHAIN_CHAINS=path`` or ``mc.configure(chains=path)``)
names chains by their loops, like OP2's CA configuration, so the science code needs
no change::

    [[chain]]
    name = "stage"
    loops = ["adt_calc", "res_calc", "bres_calc", "update"]   # loop names, in order
    repeat = 1          # the list repeated this many times forms one chain
    max_halo = 4        # most halo layers the chain may use (optional)
    ca = true           # true, false or "auto" (optional, default true)
    tile_size = 4096    # sparse tiling: seed iterations per tile (optional)

Examples
--------
>>> from meshchain.engine.chains import parse_chain_config
>>> [(c.name, c.pattern) for c in parse_chain_config('[[chain]]\\nname = "a"\\nloops = ["x", "y"]\\n')]
[('a', ('x', 'y'))]
"""

from __future__ import annotations

import tomllib
import warnings
from dataclasses import dataclass
from pathlib import Path

from ..core.cache import bounded, memo
from ..core.errors import ConfigurationError, LoopError, MeshchainWarning

__all__ = ["ChainOptions", "ChainRun", "parse_chain_config", "load_chain_config", "ChainMatcher", "CA_CHOICES",
           "refuse_nesting"]

CA_CHOICES = (True, False, "auto")


@dataclass(frozen=True, eq=False)
class ChainOptions:
    """How one chain runs.

    Attributes
    ----------
    name : str
        Statistics and diagnostics use it.
    ca : True, False or "auto"
        Communication-avoiding execution (one grouped exchange per segment), loop by loop,
        or decided per chain by the model.
    tile_size : int or None
        Sparse tiling: seed iterations per tile (``None``: untiled). See :mod:`meshchain.engine.tiling`.
    max_halo : int or None
        Most halo layers the chain may use (default: as many as can be built, 48).
    """

    name: str
    ca: object = True
    tile_size: int | None = None
    max_halo: int | None = None

    @classmethod
    def of(cls, name, ca=True, tile_size=None, max_halo=None) -> "ChainOptions":
        """The options object for these values: the same object every time (plans are keyed
        by it, and a time loop opens the same chain block again and again)."""
        try:
            found = _INTERNED[name, ca, tile_size, max_halo]
            # 1 == True and hash alike: only the very same values may share an object
            if found.ca is ca and found.tile_size is tile_size and found.max_halo is max_halo:
                return found
        except (KeyError, TypeError):
            pass
        options = cls(name, ca, tile_size, max_halo)
        bounded("chain options")
        try:
            _INTERNED[name, ca, tile_size, max_halo] = options
        except TypeError:
            pass
        return options

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ConfigurationError(f"a loop chain needs a non-empty name, got {self.name!r}.")
        if not any(self.ca is choice for choice in CA_CHOICES) and self.ca != "auto":
            raise ConfigurationError(f"loop chain {self.name!r}: ca must be True, False or 'auto', got {self.ca!r}.")
        for field in ("tile_size", "max_halo"):
            value = getattr(self, field)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigurationError(f"loop chain {self.name!r}: {field} must be a positive integer or None, "
                                         f"got {value!r}.")


_INTERNED = memo("chain options", limit=4096)


class ChainRun:
    """One execution of a chain: the loops recorded in it share this object."""

    __slots__ = ("options", "opened")

    def __init__(self, options: ChainOptions, opened=None):
        self.options = options
        self.opened = opened  # (loops pending, the trace's removals) when its block opened

    def __repr__(self) -> str:
        return f"ChainRun({self.options.name!r})"


def parse_chain_config(text: str, source: str = "<chains>") -> list["ChainSpec"]:
    """Parse the TOML text of a chain configuration into :class:`ChainSpec` objects."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"chain configuration {source}: not valid TOML: {exc}") from None
    unknown = set(document) - {"chain"}
    if unknown:
        raise ConfigurationError(f"chain configuration {source}: unknown table(s) {sorted(unknown)}; use [[chain]].")
    chains = document.get("chain", [])
    if not isinstance(chains, list):
        raise ConfigurationError(f"chain configuration {source}: 'chain' must be an array of tables ([[chain]]).")
    return [_chain_spec(entry, source, i) for i, entry in enumerate(chains)]


def _chain_spec(entry: dict, source: str, position: int) -> "ChainSpec":
    where = f"chain configuration {source}, chain #{position + 1}"
    allowed = {"name", "loops", "repeat", "max_halo", "ca", "tile_size"}
    unknown = set(entry) - allowed
    if unknown:
        raise ConfigurationError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(allowed)}.")
    loops = entry.get("loops")
    if not isinstance(loops, list) or not loops or not all(isinstance(n, str) and n for n in loops):
        raise ConfigurationError(f"{where}: 'loops' must be a non-empty list of loop names.")
    repeat = entry.get("repeat", 1)
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
        raise ConfigurationError(f"{where}: 'repeat' must be a positive integer, got {repeat!r}.")
    try:
        options = ChainOptions(entry.get("name", ""), entry.get("ca", True), entry.get("tile_size"),
                               entry.get("max_halo"))
    except ConfigurationError as exc:
        raise ConfigurationError(f"{where}: {exc}") from None
    return ChainSpec(options, tuple(loops) * repeat)


@dataclass(frozen=True)
class ChainSpec:
    """A chain named in the configuration: its options and the loop names it matches."""

    options: ChainOptions
    pattern: tuple

    @property
    def name(self) -> str:
        return self.options.name


def load_chain_config(path) -> list[ChainSpec]:
    """Read a chain configuration file (see the module docstring)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigurationError(f"cannot read the chain configuration {path}: {exc}") from None
    return parse_chain_config(text, str(path))


class ChainMatcher:
    """Recognises configured chains in the stream of recorded loop names.

    A loop whose name starts a configured pattern opens a :class:`ChainRun`; following
    loops that continue the pattern join it; when the pattern is complete the chain is
    closed. A loop that breaks the pattern closes the partial chain (which still runs as
    a chain, of the loops it got) and a warning says so.
    """

    def __init__(self, specs=()):
        self.specs = list(specs)
        self.active: tuple[ChainSpec, ChainRun, int] | None = None

    def feed(self, name: str) -> tuple[ChainRun | None, list[ChainRun]]:
        """The chain run the loop ``name`` joins (or None) and the runs this loop closed."""
        closed = []
        if self.active is not None:
            spec, run, position = self.active
            if spec.pattern[position] == name:
                position += 1
                if position == len(spec.pattern):
                    self.active = None
                    return run, [run]
                self.active = (spec, run, position)
                return run, closed
            self.active = None
            closed.append(run)
            warnings.warn(MeshchainWarning(
                f"[chain-incomplete] configured chain {spec.name!r} expected loop {spec.pattern[position]!r} "
                f"after {position} loop(s) but got {name!r}; the {position} loop(s) run as a shorter chain."),
                stacklevel=4)
        for spec in self.specs:
            if spec.pattern[0] == name:
                run = ChainRun(spec.options)
                if len(spec.pattern) == 1:
                    return run, closed + [run]
                self.active = (spec, run, 1)
                return run, closed
        return None, closed


def refuse_nesting(open_run: ChainRun | None, options: ChainOptions) -> None:
    if open_run is not None:
        raise LoopError(f"loop chain {options.name!r} opened inside loop chain {open_run.options.name!r}; chains "
                        f"cannot be nested: close the outer block first.")
