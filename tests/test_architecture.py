"""The arrows of docs/architecture.md are checked, not hoped for: `lint-imports` (run by `make check`)
passes on the project as it is, and fails, naming the broken contract, when one forbidden import
is added. The check runs on a copy of the packages, so the tree under test is never touched."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("chat", "routing", "cache_layer", "ops", "lib", "config", "store", "bottest")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


@pytest.fixture
def project_copy(tmp_path: Path) -> Path:
    if not LINT_IMPORTS.exists():
        pytest.skip("import-linter is not installed (make install installs it)")
    for name in PACKAGES:
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", "pyproject.toml", "--no-cache"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_project_keeps_every_contract(project_copy: Path) -> None:
    clean = lint_imports(project_copy)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "0 broken" in clean.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("routing/probe.py", "from chat.models import Conversation", "The router imports nothing of chat or ops"),
        ("cache_layer/probe.py", "from routing.decide import strategy", "The cache imports nothing of the router"),
        ("chat/probe.py", "from routing.decide import strategy", "Chat reaches the router only through its door"),
        ("chat/probe.py", "from cache_layer import services", "Chat reaches the router only through its door"),
        ("routing/probe.py", "import openai", "Only routing.providers.openai_remote imports the openai SDK"),
        ("lib/probe.py", "from routing import types", "Lib is the bottom"),
        # The router's rooms: an upward import, and one between two rooms that must stay independent.
        ("routing/upstream/probe.py", "from routing.decide import strategy", "The router's rooms"),
        ("routing/orders/probe.py", "from routing.prompt import build", "The router's rooms"),
        # Exhaustive: a new flat module at the router's top level must take a place in the layers.
        ("routing/probe.py", "import json", "The router's rooms"),
        # The bot tests: on top of everything, and through chat's sandbox door, never a face.
        ("chat/probe.py", "from bottest import runner", "The bot tests are the top"),
        (
            "bottest/probe.py",
            "from chat.consumers import shopper",
            "The bot tests reach chat only through chat.sandbox",
        ),
    ],
)
def test_a_forbidden_import_breaks_the_contract_that_forbids_it(
    project_copy: Path, module: str, line: str, contract: str
) -> None:
    (project_copy / module).write_text(f"{line}\n")
    broken = lint_imports(project_copy)

    assert broken.returncode != 0
    assert f"{contract}" in broken.stdout and "BROKEN" in broken.stdout
    assert module.removesuffix(".py").replace("/", ".") in broken.stdout
