"""The package as a user installs it: ``python -m build`` makes a wheel of a copy of the
source tree, a new virtual environment (no site packages) installs it from the wheel with
its dependencies, and, away from the source tree, ``python -m meshchain info`` reports that
installation and ``python -m meshchain demo --quick`` (what ``make demo`` runs, small) prints
its table."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import meshchain as mc

ROOT = Path(__file__).resolve().parents[1]


def run(command, *, cwd, env=None, timeout=900) -> str:
    done = subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, command))} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def source_copy(into: Path) -> Path:
    """The tracked files of the source tree, copied (the build writes next to them)."""
    files = run(["git", "ls-files"], cwd=ROOT).splitlines()
    for name in files:
        target = into / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    return into


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_wheel_installs_in_a_new_environment_and_runs_the_demo(tmp_path, meshchain_cache_dir):
    """... and the demo prints its profitability table with a row per workload, and says that
    loop by loop and communication-avoiding agree (the session's cache: the wheel's generated
    loops are the source tree's)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout (the wheel is built from the tracked files)")
    source = source_copy(tmp_path / "source")
    # the build backend of this environment (pyproject's build requirements, checked by build): a
    # fresh isolated one would download and install setuptools again for every run
    run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", tmp_path / "dist", source], cwd=tmp_path)
    wheels = list((tmp_path / "dist").glob("meshchain-*.whl"))
    assert [w.name for w in wheels] == [f"meshchain-{mc.__version__}-py3-none-any.whl"]
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", venv], cwd=tmp_path)
    python = venv / "bin" / "python"
    # --no-compile: no bytecode for every module of SciPy, Numba and NumPy up front (Python
    # writes it for the modules imported, as they are imported)
    run([python, "-m", "pip", "install", "--quiet", "--no-compile", wheels[0]], cwd=tmp_path)
    away = tmp_path / "elsewhere"
    away.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "MESHCHAIN_", "VIRTUAL_ENV"))}
    env.update(MESHCHAIN_CACHE_DIR=meshchain_cache_dir, PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    where = run([python, "-c", "import meshchain; print(meshchain.__file__)"], cwd=away, env=env).strip()
    assert Path(where).is_relative_to(venv), where
    info = run([python, "-m", "meshchain", "info"], cwd=away, env=env)
    assert re.search(rf"^meshchain +{re.escape(mc.__version__)}$", info, re.MULTILINE) and str(venv) in info, info
    demo = run([python, "-m", "meshchain", "demo", "--quick"], cwd=away, env=env)
    rows = [line.split()[:2] for line in demo.splitlines() if line.strip()]
    assert all([workload, "2"] in rows for workload in ("synthetic", "airfoil", "vertex")), demo
    assert "results: loop by loop and communication-avoiding agree in every row" in demo
