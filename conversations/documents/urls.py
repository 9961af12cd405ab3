"""The documents' endpoints and pages."""

from django.urls import path

from conversations.documents import views

urlpatterns = [
    path("documents/", views.library, name="documents"),
    path("documents/upload/", views.upload, name="documents-upload"),
    path("documents/<int:pk>/", views.detail, name="document"),
    path("documents/<int:pk>/delete/", views.delete, name="document-delete"),
    path("documents/<int:pk>/passage/", views.passage, name="document-passage"),
    path(
        "chat/conversations/<int:pk>/documents/", views.conversation_documents, name="conversation-documents"
    ),
    path(
        "chat/conversations/<int:pk>/documents/<int:document_id>/detach/",
        views.detach,
        name="conversation-document-detach",
    ),
    path("settings/documents/", views.documents_page, name="documents-page"),
]
