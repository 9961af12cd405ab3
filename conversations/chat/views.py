"""Pages and the chat UI's small JSON endpoints.

Every view requires a signed-in user (JSON endpoints answer 401 rather than redirect),
and a conversation id that is not the user's is a 404, never a 403.
"""

from __future__ import annotations

from dataclasses import asdict

from asgiref.sync import async_to_sync
from django import forms
from django.contrib.auth.decorators import login_required
from django.db.models import Q
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from conversations.chat import lifecycle, model_choice
from conversations.chat import tree as tree_ops
from conversations.chat.groups import broadcast, conversation_group, user_group
from conversations.chat.json_guard import json_body, login_required_json
from conversations.cluster.registry import PROCESS_ID, Liveness
from conversations.cluster.registry import enabled as cluster_enabled
from conversations.models import Conversation, Message
from conversations.workspace.starting import page_state, start_conversation

LIST_LIMIT = 100
SEARCH_MAX_CHARS = 200


def _own_conversation(request: HttpRequest, pk: int) -> Conversation:
    return get_object_or_404(Conversation, pk=pk, owner=request.user)


def _notify(group: str, event: str, **data) -> None:
    async_to_sync(broadcast)(group, event, **data)


# --- Pages ---------------------------------------------------------------------------


def _chat_page(request: HttpRequest, conversation: Conversation | None) -> HttpResponse:
    state = {
        "conversation_id": conversation.pk if conversation else None,
        "conversations": _conversation_rows(request.user, ""),
        "username": request.user.get_username(),
        "urls": {
            "list": "/chat/conversations/",
            "create": "/chat/conversations/new/",
            "websocket": "/ws/chat/",
        },
        # The model picker: the models this user may pick, and their default.
        "models": [asdict(o) for o in model_choice.options_for(request.user.is_staff)],
        "default_model": model_choice.default_model(request.user),
        **page_state(request),
    }
    return render(request, "conversations/chat.html", {"state": state, "conversation": conversation})


@login_required
@never_cache
def home(request: HttpRequest) -> HttpResponse:
    return _chat_page(request, None)


@login_required
@never_cache
def conversation_page(request: HttpRequest, pk: int) -> HttpResponse:
    return _chat_page(request, _own_conversation(request, pk))


# --- JSON: the conversation list -----------------------------------------------------


def _conversation_rows(user, query: str, archived: bool = False) -> list[dict]:
    """The list: pinned first. Temporary chats are never in it; archived ones only when
    searching (marked as such) or when asked for (``archived``)."""
    conversations = Conversation.objects.filter(owner=user, temporary=False)
    if query:
        conversations = conversations.filter(
            Q(title__icontains=query) | Q(messages__content__icontains=query)
        ).distinct()
    else:
        conversations = conversations.filter(archived_at__isnull=not archived)
    fields = ("id", "title", "updated_at", "pinned", "folder_id", "archived_at")
    rows = list(conversations.order_by("-pinned", "-updated_at", "-id").values(*fields)[:LIST_LIMIT])
    snippets: dict[int, str] = {}
    if query and rows:
        matches = (
            Message.objects.filter(conversation_id__in=[r["id"] for r in rows], content__icontains=query)
            .order_by("created_at")
            .values_list("conversation_id", "content")
        )
        for conversation_id, content in matches:
            if conversation_id not in snippets:
                snippets[conversation_id] = _snippet(content, query)
    return [
        {
            "id": r["id"],
            "title": r["title"],
            "updated_at": r["updated_at"].isoformat(),
            "snippet": snippets.get(r["id"], ""),
            "pinned": r["pinned"],
            "folder_id": r["folder_id"],
            "archived": r["archived_at"] is not None,
        }
        for r in rows
    ]


def _snippet(content: str, query: str, width: int = 80) -> str:
    at = content.lower().find(query.lower())
    if at < 0:
        return ""
    start = max(0, at - width // 2)
    text = " ".join(content[start : start + width].split())
    return ("…" if start else "") + text + ("…" if start + width < len(content) else "")


@require_GET
@login_required_json
@never_cache
def conversation_list(request: HttpRequest) -> JsonResponse:
    query = request.GET.get("q", "").strip()[:SEARCH_MAX_CHARS]
    archived = request.GET.get("archived") == "1"
    rows = _conversation_rows(request.user, query, archived)
    return JsonResponse({"conversations": rows, "query": query, "archived": archived})


@require_POST
@login_required_json
def conversation_create(request: HttpRequest) -> JsonResponse:
    """``{preset_id?, temporary?}``: the untouched new chat (or a fresh temporary one)."""
    conversation = start_conversation(request.user, json_body(request))
    _notify(user_group(request.user.pk), "conversations")
    return JsonResponse({"conversation": tree_ops.conversation_dict(conversation)}, status=201)


@require_GET
@login_required_json
@never_cache
def conversation_detail(request: HttpRequest, pk: int) -> JsonResponse:
    conversation = _own_conversation(request, pk)
    tree = tree_ops.Tree.load(conversation)
    # With several processes, the owners' liveness is the failover loop's business.
    liveness = Liveness({PROCESS_ID}, known=set()) if cluster_enabled() else None
    orphans = lifecycle.orphaned(tree.by_id.values(), set(), liveness)
    thread = tree_ops.thread_dict(tree)
    lifecycle.show_interrupted(thread["messages"], orphans)
    if orphans:  # the read shows them interrupted; the lifecycle stores them so
        lifecycle.interrupt_orphan_rows(orphans)
    return JsonResponse(thread)


@require_GET
@login_required_json
@never_cache
def message_text(request: HttpRequest, pk: int) -> JsonResponse:
    """One message's whole text, for a page that got it cut to fit a websocket frame."""
    row = (
        Message.objects.filter(pk=pk, conversation__owner=request.user, conversation__deleted_at__isnull=True)
        .values("pk", "content", "reasoning")
        .first()
    )
    if row is None:
        return JsonResponse({"detail": "no such message among your conversations"}, status=404)
    return JsonResponse({"id": row["pk"], "content": row["content"], "reasoning": row["reasoning"]})


class ConversationForm(forms.ModelForm):
    title = forms.CharField(max_length=200, strip=True)
    system_prompt = forms.CharField(max_length=20_000, required=False, strip=False)
    temperature = forms.FloatField(min_value=0.0, max_value=2.0)
    top_p = forms.FloatField(min_value=0.01, max_value=1.0)
    top_k = forms.IntegerField(min_value=0, max_value=1000)
    max_tokens = forms.IntegerField(min_value=1, max_value=32_768)
    tools_enabled = forms.BooleanField(required=False)
    tools_approval = forms.BooleanField(required=False)

    class Meta:
        model = Conversation
        fields = [
            "title",
            "system_prompt",
            "temperature",
            "top_p",
            "top_k",
            "max_tokens",
            "tools_enabled",
            "tools_approval",
        ]


@require_POST
@login_required_json
def conversation_update(request: HttpRequest, pk: int) -> JsonResponse:
    """Rename and/or change the settings; the body (JSON or form) may name any subset."""
    conversation = _own_conversation(request, pk)
    incoming = json_body(request) if request.content_type == "application/json" else request.POST.dict()
    fields = ConversationForm.Meta.fields
    data = {name: getattr(conversation, name) for name in fields}
    data.update({k: v for k, v in incoming.items() if k in fields})
    old_title = conversation.title
    form = ConversationForm(data, instance=conversation)
    if not form.is_valid():
        return JsonResponse({"errors": form.errors.get_json_data()}, status=400)
    conversation = form.save(commit=False)
    if conversation.title != old_title:
        # A title the user chose is theirs: the model never replaces it.
        conversation.title_source = Conversation.TitleSource.USER
    conversation.save()
    _notify(user_group(request.user.pk), "conversations")
    _notify(conversation_group(conversation.pk), "settings")
    return JsonResponse({"conversation": tree_ops.conversation_dict(conversation)})


@require_POST
@login_required_json
def conversation_delete(request: HttpRequest, pk: int) -> JsonResponse:
    _own_conversation(request, pk)
    # Hidden now, purged with its messages by housekeeping after the retention period.
    Conversation.objects.filter(pk=pk).update(deleted_at=timezone.now())
    # Open sockets stop its answers and tell their tabs.
    _notify(conversation_group(pk), "deleted", conversation_id=pk)
    _notify(user_group(request.user.pk), "conversations")
    return JsonResponse({"deleted": pk})
