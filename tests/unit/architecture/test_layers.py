"""The layer contract (pyproject.toml [tool.importlinter]) holds, and it does fail on an upward import."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process  # starts processes: not in `make test-fast`

REPO = Path(__file__).resolve().parents[3]
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LINT), "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_repository_keeps_its_layers() -> None:
    r = _lint(REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


def test_an_upward_import_breaks_the_contract(tmp_path: Path) -> None:
    shutil.copytree(REPO / "tuner", tmp_path / "tuner", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    with (tmp_path / "tuner" / "study" / "study.py").open("a") as f:
        f.write("\n\ndef _late() -> None:\n    from tuner.loop import run_cycle  # noqa: F401\n")
    r = _lint(tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "tuner.study.study -> tuner.loop" in r.stdout


KERNELS = {"__init__", "errors", "spec", "catalog", "agent", "context", "loop"}


def test_the_top_level_holds_only_the_shared_kernels() -> None:
    """Every other module lives in the package of its concern (docs/ARCHITECTURE.md, "Packages")."""
    top = {p.stem for p in (REPO / "tuner").glob("*.py")}
    assert top == KERNELS, f"move {sorted(top - KERNELS)} into a package of its concern"


def test_no_module_imports_itself_through_a_circle() -> None:
    import grimp

    g = grimp.build_graph("tuner", exclude_type_checking_imports=True)
    circles = [(m, other) for m in g.modules for other in g.find_modules_directly_imported_by(m)
               if m != other and g.chain_exists(importer=other, imported=m)]
    assert circles == [], f"import circles: {circles[:5]}"
