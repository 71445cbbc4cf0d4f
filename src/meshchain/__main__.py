"""``python -m meshchain``: the profitability report and the demo.

Commands::

    python -m meshchain report synthetic --ranks 2 4 --loops 2 8 32   # the model against measurement
    python -m meshchain demo                                          # what `make demo` runs
    python -m meshchain info                                          # versions and settings, for bug reports
"""

from __future__ import annotations

import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"report": ("report", "main"), "report-worker": ("report", "worker_main"),
                "demo": ("report", "demo_main"), "info": ("info", "main"),
                "krylov-worker": ("krylov_report", "worker_main")}
    if not argv or argv[0] not in commands:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    import importlib

    module, function = commands[argv[0]]
    return getattr(importlib.import_module(f".apps.{module}", __package__), function)(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
