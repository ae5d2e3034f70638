"""Trained models memoised on disk, so a restart loads what the previous start trained.

Training the FAQ model and the scope classifier (``routing.faq``) is seconds to tens of seconds of
CPU at every start of a server process, most of it scikit-learn's L-BFGS fit holding the GIL;
measured with a sampling profiler on a 2-core machine, it was half of the 50 s of CPU a Daphne
process spent before ``/healthz`` said ready, and every worker of a deployment paid it again at
every restart. Equal inputs give equal models (the fits are deterministic), so the fitted object
is pickled under a key that hashes everything it was fitted from: the caller's inputs, the bytes
of the code and data files that define the fit, and the versions of Python, NumPy and
scikit-learn (a pickle is only read back by the versions that wrote it).

The directory is the deployment's own (``KEFU_MODEL_CACHE_DIR``); a file there is code to
whoever can write it, like the project's files beside it. A file that cannot be read back (torn,
another version, deleted meanwhile) is fitted again and replaced; a disk that cannot be written
only costs the next start its training time. Writes are atomic (a temporary file renamed), so
several processes starting at once read a whole file or none. The newest :data:`KEEP_PER_NAME`
files of each name are kept; older ones (an FAQ since edited) are deleted after a write.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import sys
from collections.abc import Callable, Iterable
from importlib import metadata
from pathlib import Path
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Files kept per model name (the newest by modification time; a hit refreshes it).
KEEP_PER_NAME = 8

#: Packages whose versions are part of every key (the pickled objects hold their arrays/classes).
_VERSIONED = ("numpy", "scikit-learn", "scipy")


def _versions() -> str:
    parts = [sys.version.split()[0]]
    for name in _VERSIONED:
        try:
            parts.append(f"{name}={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{name}=none")
    return ";".join(parts)


def fit_key(inputs: object, files: Iterable[Path]) -> str:
    """The memo key (32 hex digits) of a fit: the ``repr`` of ``inputs`` (tuples, strings,
    numbers and frozen dataclasses of them have a stable one), the bytes of each of ``files``
    (the code and data that define the fit; a missing file counts as empty) and the library
    versions. Raises nothing."""
    h = hashlib.sha256()
    h.update(_versions().encode())
    h.update(b"\x00")
    h.update(repr(inputs).encode())
    for path in files:
        h.update(b"\x00" + str(path.name).encode() + b"\x00")
        try:
            h.update(path.read_bytes())
        except OSError:
            pass
    return h.hexdigest()[:32]


def load_or_fit(directory: str | Path | None, name: str, key: str, fit: Callable[[], T]) -> T:
    """The object stored as ``<directory>/<name>-<key>.pickle``, else ``fit()``'s result, stored
    there for the next caller. ``directory`` ``None`` or empty: always ``fit()``. Raises what
    ``fit`` raises; never a disk error."""
    if not directory:
        return fit()
    folder = Path(directory)
    path = folder / f"{name}-{key}.pickle"
    try:
        with path.open("rb") as f:
            obj: T = pickle.load(f)
        try:
            os.utime(path)  # the newest files are the ones kept
        except OSError:
            pass
        log.debug("%s loaded from %s", name, path)
        return obj
    except FileNotFoundError:
        pass
    except Exception as e:  # torn, written by another version: fit again and replace it
        log.warning("could not read %s (%s: %s); fitting again", path, type(e).__name__, e)
    obj = fit()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{name}-{key}.{os.getpid()}.tmp"
        with tmp.open("wb") as f:
            pickle.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
        _prune(folder, name)
    except OSError as e:
        log.info("could not store %s in %s (%s); the next start fits it again", name, folder, e)
    return obj


def _prune(folder: Path, name: str) -> None:
    """Delete all but the newest :data:`KEEP_PER_NAME` files of ``name``."""
    files = []
    for p in folder.glob(f"{name}-*.pickle"):
        try:
            files.append((p.stat().st_mtime, p))
        except OSError:
            continue
    files.sort(reverse=True)
    for _, p in files[KEEP_PER_NAME:]:
        try:
            p.unlink()
        except OSError:
            pass
