"""Prompt presets: a saved system prompt with sampling settings. Each user keeps their own on
``/settings/presets/`` (a server-rendered page); the admin sets site-wide ones (no owner).
The chat page offers them when a conversation starts and inserts one's prompt on ``/``."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import F, Q
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from conversations.models import Preset
from conversations.workspace.http import login_required_json

PRESET_FIELDS = ("system_prompt", "temperature", "top_p", "top_k", "max_tokens")


class PresetForm(forms.ModelForm):
    name = forms.CharField(max_length=80, strip=True)
    system_prompt = forms.CharField(max_length=20_000, required=False, strip=False, widget=forms.Textarea)
    temperature = forms.FloatField(min_value=0.0, max_value=2.0, initial=0.7)
    top_p = forms.FloatField(min_value=0.01, max_value=1.0, initial=0.95)
    top_k = forms.IntegerField(min_value=0, max_value=1000, initial=0)
    max_tokens = forms.IntegerField(min_value=1, max_value=32_768, initial=512)

    class Meta:
        model = Preset
        fields = ["name", *PRESET_FIELDS]


def presets_for(user):
    """The user's own presets, then the site-wide ones."""
    mine_first = F("owner_id").asc(nulls_last=True)
    return Preset.objects.filter(Q(owner=user) | Q(owner__isnull=True)).order_by(mine_first, "name", "id")


def preset_dict(preset: Preset) -> dict:
    return {
        "id": preset.pk,
        "name": preset.name,
        "site_wide": preset.site_wide,
        **{name: getattr(preset, name) for name in PRESET_FIELDS},
    }


def preset_settings(user, preset_id) -> dict | None:
    """The settings a new conversation takes from preset ``preset_id`` (one the user may use)."""
    try:
        preset = presets_for(user).get(pk=int(preset_id))
    except (Preset.DoesNotExist, TypeError, ValueError):
        return None
    return {name: getattr(preset, name) for name in PRESET_FIELDS}


@require_GET
@login_required_json
@never_cache
def preset_list(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"presets": [preset_dict(p) for p in presets_for(request.user)]})


@require_http_methods(["GET", "POST"])
@login_required
@never_cache
def presets_page(request: HttpRequest) -> HttpResponse:
    form = PresetForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        preset = form.save(commit=False)
        preset.owner = request.user
        preset.save()
        messages.success(request, f"Saved the preset “{preset.name}”.")
        return redirect("presets")
    context = {
        "form": form,
        "own": Preset.objects.filter(owner=request.user),
        "site_wide": Preset.objects.filter(owner__isnull=True),
    }
    return render(request, "conversations/presets.html", context, status=400 if form.errors else 200)


@require_POST
@login_required
def preset_delete(request: HttpRequest, pk: int) -> HttpResponse:
    preset = get_object_or_404(Preset, pk=pk, owner=request.user)
    preset.delete()
    messages.success(request, f"Deleted the preset “{preset.name}”.")
    return redirect("presets")
