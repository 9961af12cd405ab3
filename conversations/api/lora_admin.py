"""vLLM's run-time LoRA endpoints, for admins (a superuser's API key): ``POST
/v1/load_lora_adapter`` ``{"lora_name", "lora_path", "base_model_name"?}`` and ``POST
/v1/unload_lora_adapter`` ``{"lora_name"}``. Loading reads a directory on the server, so
no one else may call them (to others they do not exist: a 404)."""

from __future__ import annotations

import asyncio

from django.http import HttpRequest, HttpResponse
from ninja import Schema

from conversations.api.app import ERRORS, api
from conversations.api.errors import ApiError, invalid
from conversations.ops.lora_adapters import AdapterError, load_adapter, unload_adapter


class LoadLoraRequest(Schema):
    lora_name: str
    lora_path: str
    base_model_name: str | None = None  # ours: the model to load it on (default: the first)


class UnloadLoraRequest(Schema):
    lora_name: str


def _admin_only(request: HttpRequest) -> None:
    if not request.auth.owner.is_superuser:
        raise ApiError(404, "Not found.", code="not_found")


@api.post("/load_lora_adapter", response={200: str, **ERRORS}, summary="Load a LoRA adapter (admins)")
async def load_lora_adapter(request: HttpRequest, body: LoadLoraRequest) -> HttpResponse:
    _admin_only(request)
    try:
        await asyncio.to_thread(load_adapter, body.lora_name, body.lora_path, body.base_model_name)
    except AdapterError as exc:
        raise invalid(str(exc), param="lora_path") from None
    request.api_log.finish(200)
    return HttpResponse(
        f"Success: LoRA adapter '{body.lora_name}' added successfully.", content_type="text/plain"
    )


@api.post("/unload_lora_adapter", response={200: str, **ERRORS}, summary="Unload a LoRA adapter (admins)")
async def unload_lora_adapter(request: HttpRequest, body: UnloadLoraRequest) -> HttpResponse:
    _admin_only(request)
    if not await asyncio.to_thread(unload_adapter, body.lora_name):
        raise ApiError(
            404, f"The LoRA adapter `{body.lora_name}` is not loaded.", param="lora_name", code="not_found"
        )
    request.api_log.finish(200)
    return HttpResponse(
        f"Success: LoRA adapter '{body.lora_name}' removed successfully.", content_type="text/plain"
    )
