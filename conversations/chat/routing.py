from django.urls import path

from conversations.chat import consumers

websocket_urlpatterns = [
    path("ws/chat/", consumers.ChatConsumer.as_asgi()),
    path("ws/chat/<int:conversation_id>/", consumers.ChatConsumer.as_asgi()),
]
