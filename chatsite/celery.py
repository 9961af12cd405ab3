"""Celery app. Eager (in-process) by default; a Redis broker when REDIS_URL is set."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")

app = Celery("chatsite")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
