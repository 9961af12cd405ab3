"""The OpenAI-compatible API under /v1/ and the API-keys settings pages."""

from django.urls import path

from conversations.api import embeddings, key_pages, lora_admin
from conversations.api.app import api
from conversations.api.errors import api_not_found

# Importing them registers /v1/embeddings and the LoRA endpoints before api.urls.
assert embeddings.create_embeddings and lora_admin.load_lora_adapter

urlpatterns = [
    path("v1/", api.urls),
    # After the API's own routes: anything else under /v1 is an OpenAI-shaped 404.
    path("v1/<path:path>", api_not_found),
    path("settings/api-keys/", key_pages.api_keys, name="api_keys"),
    path("settings/api-keys/<int:key_id>/revoke/", key_pages.revoke_api_key, name="api_key_revoke"),
]
