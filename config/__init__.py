"""kefu's Django configuration package (settings, ASGI, URLs, Celery)."""

from .celery import app as celery_app

__all__ = ["celery_app"]
