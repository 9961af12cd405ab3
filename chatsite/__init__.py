from chatsite.kernel_threads import set_kernel_thread_waits

# Every server process (Daphne, manage.py, Celery) imports this package before torch.
set_kernel_thread_waits()

from chatsite.celery import app as celery_app  # noqa: E402

__all__ = ["celery_app"]
