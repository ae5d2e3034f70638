"""kefu's Django configuration package (settings, ASGI, URLs, Celery)."""

from lib.native_threads import limit_native_threads

limit_native_threads()  # before anything imports numpy (lib/native_threads.py says why)

from .celery import app as celery_app  # noqa: E402

__all__ = ["celery_app"]
