"""The Celery application. Broker is Redis when ``REDIS_URL`` is set; otherwise tasks run eagerly."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("kefu")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
