"""The Celery application. Broker is Redis when ``REDIS_URL`` is set; otherwise tasks run eagerly.

After each task the worker records its open Redis connections (``kefu_redis_connections`` in
``lib.metrics``), so that with ``PROMETHEUS_MULTIPROC_DIR`` shared with the web workers ``/metrics``
shows the Celery worker's connections too."""

import os
from typing import Any

from celery import Celery
from celery.signals import task_postrun

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("kefu")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@task_postrun.connect
def _record_redis_connections(**_kwargs: Any) -> None:
    from lib.metrics import refresh_redis_connections

    refresh_redis_connections()
