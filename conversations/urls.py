from django.urls import path

from conversations.chat import views
from conversations.transfer import views as data_views

urlpatterns = [
    path("c/<int:pk>/", views.conversation_page, name="conversation"),
    path("chat/conversations/", views.conversation_list, name="conversation-list"),
    path("chat/conversations/new/", views.conversation_create, name="conversation-create"),
    path("chat/conversations/<int:pk>/", views.conversation_detail, name="conversation-detail"),
    path("chat/conversations/<int:pk>/update/", views.conversation_update, name="conversation-update"),
    path("chat/conversations/<int:pk>/delete/", views.conversation_delete, name="conversation-delete"),
    path("conversations/<int:pk>/export.json", data_views.export_conversation_json, name="export-json"),
    path("conversations/<int:pk>/export.md", data_views.export_conversation_markdown, name="export-markdown"),
    path("settings/data/", data_views.data_page, name="data"),
    path("settings/data/export/", data_views.export_all, name="data-export"),
    path("settings/data/import/", data_views.import_file, name="data-import"),
    path("settings/data/jobs/<int:job_id>/download/", data_views.download_job, name="data-download"),
]
