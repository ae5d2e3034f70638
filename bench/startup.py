"""Time to ready: how long `make run` takes to answer /healthz with 200, on a fresh clone and on a
restart.

For each of ``--runs`` rounds: clone this checkout into a temporary folder, run `make install`
there (not timed: it is pip's work), then time `make run` from its start to the first HTTP 200 of
`/healthz` (the first start: migrate, load the demo FAQ, train the FAQ model, warm the router up),
stop it, and time a second `make run` the same way (a restart: the database and the embedding
cache are there). Prints one row per round and the medians.

    .venv/bin/python bench/startup.py --runs 3

Needs git and the network access `make install` needs (the package index); nothing else. Each
round uses a port of its own and its own SQLite file; everything started is stopped.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def healthz_status(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return None


def timed_start(clone: Path, port: int, log: Path, timeout_s: float) -> float:
    """Seconds from `make run` to the first 200 of /healthz; the server is stopped afterwards."""
    env = {**os.environ, "PORT": str(port), "HOST": "127.0.0.1"}
    for name in ("DATABASE_URL", "REDIS_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        env.pop(name, None)
    started = time.monotonic()
    with log.open("ab") as out:
        proc = subprocess.Popen(
            ["make", "-s", "run"], cwd=clone, env=env, stdout=out, stderr=out, start_new_session=True
        )
    try:
        while time.monotonic() - started < timeout_s:
            if proc.poll() is not None:
                raise RuntimeError(f"make run exited with {proc.returncode}; see {log}")
            if healthz_status(port) == 200:
                return time.monotonic() - started
            time.sleep(0.1)
        raise RuntimeError(f"/healthz not 200 after {timeout_s:.0f} s; see {log}")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--timeout-s", type=float, default=300.0)
    args = parser.parse_args()
    first, restart = [], []
    print("| round | install (not timed) | first start to /healthz 200 | restart to /healthz 200 |")
    print("|---:|---:|---:|---:|")
    for n in range(1, args.runs + 1):
        with tempfile.TemporaryDirectory(prefix="kefu-startup-") as tmp:
            clone = Path(tmp) / "kefu"
            subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
            t0 = time.monotonic()
            log = Path(tmp) / "run.log"
            with log.open("wb") as out:
                subprocess.run(["make", "-s", "install"], cwd=clone, check=True, stdout=out, stderr=out)
            install_s = time.monotonic() - t0
            port = free_port()
            first.append(timed_start(clone, port, log, args.timeout_s))
            restart.append(timed_start(clone, port, log, args.timeout_s))
            print(f"| {n} | {install_s:.1f} s | {first[-1]:.1f} s | {restart[-1]:.1f} s |", flush=True)
    print(f"| median | | {statistics.median(first):.1f} s | {statistics.median(restart):.1f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
