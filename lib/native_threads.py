"""One thread for the native math libraries in kefu's processes, unless the operator says otherwise.

numpy's OpenBLAS, and the OpenMP runtime and OpenBLAS that faiss brings, start a pool of one
thread per core the first time they compute, and those threads spin while they wait for more
work. A web process calls them for small products many times a second (the FAQ match, the cache
index, the decline check), so with two worker processes on two cores the pools of each spin on
the cores the other needs: measured with bench/load.py (16 shoppers, two workers, one per core),
9.1 answers/s at 205 ms of server CPU per answer, against 66.7 answers/s at 23 ms with one thread
each. Such small products gain nothing from more threads; the cores are the processes'.

``limit_native_threads()`` sets ``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS`` and
``MKL_NUM_THREADS`` to ``KEFU_NATIVE_THREADS`` (default 1) where the environment does not set
them already. The libraries read them when they load, so it must run before numpy is imported:
``config/__init__.py`` calls it, the first module of every entry point (ASGI servers, manage.py,
Celery). Libraries loaded before it (a host program that imported numpy first) are limited with
threadpoolctl at the same call.
"""

from __future__ import annotations

import os
import sys

from lib.settings_env import env

VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def limit_native_threads() -> int:
    """Apply the limit (see the module docstring); returns the number of threads chosen.

    Raises:
        ValueError: ``KEFU_NATIVE_THREADS`` is not a positive integer.
    """
    raw = env.raw("KEFU_NATIVE_THREADS", "1")
    try:
        threads = int(raw)
    except ValueError:
        threads = 0
    if threads < 1:
        raise ValueError(f"KEFU_NATIVE_THREADS={raw!r} must be a positive integer")
    for name in VARIABLES:
        os.environ.setdefault(name, str(threads))
    if "numpy" in sys.modules:  # too late for the variables: limit the pools already there
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=threads)
    return threads
