"""Exports of one conversation and the data page (export everything, import a file)."""

from django.urls import path

from conversations.transfer import views

urlpatterns = [
    path("conversations/<int:pk>/export.json", views.export_conversation_json, name="export-json"),
    path("conversations/<int:pk>/export.md", views.export_conversation_markdown, name="export-markdown"),
    path("settings/data/", views.data_page, name="data"),
    path("settings/data/export/", views.export_all, name="data-export"),
    path("settings/data/import/", views.import_file, name="data-import"),
    path("settings/data/jobs/<int:job_id>/download/", views.download_job, name="data-download"),
]
