"""Project processes for tests that run kefu the way production does: management commands and a
Celery worker, each a real subprocess with the environment the test gives it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def manage(env: dict[str, str], *args: str) -> str:
    """Run ``python manage.py ARGS`` with ``env`` in the project; its standard output. Raises
    ``CalledProcessError`` when the command fails."""
    out = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, check=True, capture_output=True, text=True
    )
    return out.stdout


def celery_worker(env: dict[str, str], log: Path, *, loglevel: str = "INFO") -> subprocess.Popen[bytes]:
    """A ``celery worker --pool=solo`` of the project with ``env``, its output in ``log``, in a
    session of its own (so a test can signal its whole group)."""
    return subprocess.Popen(
        [
            str(Path(sys.executable).parent / "celery"),
            "-A",
            "config",
            "worker",
            "--pool=solo",
            f"--loglevel={loglevel}",
        ],
        cwd=ROOT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
