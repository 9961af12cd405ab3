"""The chat page and its JSON endpoints (the websocket's routes are in ``conversations.chat.routing``)."""

from django.urls import path

from conversations.chat import views

urlpatterns = [
    path("", views.home, name="home"),
    path("c/<int:pk>/", views.conversation_page, name="conversation"),
    path("chat/conversations/", views.conversation_list, name="conversation-list"),
    path("chat/conversations/new/", views.conversation_create, name="conversation-create"),
    path("chat/conversations/<int:pk>/", views.conversation_detail, name="conversation-detail"),
    path("chat/conversations/<int:pk>/update/", views.conversation_update, name="conversation-update"),
    path("chat/conversations/<int:pk>/delete/", views.conversation_delete, name="conversation-delete"),
    path("chat/messages/<int:pk>/text/", views.message_text, name="message-text"),
]
