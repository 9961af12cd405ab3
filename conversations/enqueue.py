"""Start a Celery task of ``conversations.tasks`` by name, once the current transaction commits.

The modules that start background work (titles, data jobs) are the ones the task module
wraps, so they name the task instead of importing it.
"""

from __future__ import annotations

from celery import Task, current_app

GENERATE_TITLE = "conversations.tasks.generate_title"
RUN_EXPORT = "conversations.tasks.run_export"
RUN_IMPORT = "conversations.tasks.run_import"
RUN_DOCUMENT = "conversations.tasks.run_document_extraction"


def enqueue_on_commit(task_name: str, *args: object) -> None:
    """``delay_on_commit`` of the named task: run in this process in eager mode (the
    embedded defaults), sent to the broker otherwise; at once outside a transaction."""
    _registered(task_name).delay_on_commit(*args)


def tasks_run_here() -> bool:
    """Tasks run eagerly, in the process that starts them (the embedded defaults)."""
    return bool(current_app.conf.task_always_eager)


def _registered(task_name: str) -> Task:
    # Looked up rather than sent with ``send_task``, which would skip eager mode. A site
    # process starts no worker, so Celery's lazy autodiscovery may not have run in it yet.
    if task_name not in current_app.tasks:
        current_app.autodiscover_tasks(force=True)
    return current_app.tasks[task_name]
