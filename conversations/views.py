from __future__ import annotations

from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache

from conversations.engine import engine_status
from conversations.forms import SignUpForm
from conversations.health import channel_layer_ready, database_ready


@login_required
def home(request: HttpRequest) -> HttpResponse:
    return render(request, "conversations/chat.html")


def signup(request: HttpRequest) -> HttpResponse:
    if request.user.is_authenticated:
        return redirect("home")
    form = SignUpForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        user = form.save()
        login(request, user)
        return redirect("home")
    return render(request, "registration/signup.html", {"form": form})


@never_cache
async def healthz(request: HttpRequest) -> JsonResponse:
    db_ok, db_detail = await database_ready()
    layer_ok, layer_detail = await channel_layer_ready()
    engine = engine_status()
    body = {
        "ok": db_ok and layer_ok and engine["ready"],
        "database": {"ready": db_ok, "detail": db_detail},
        "channel_layer": {"ready": layer_ok, "detail": layer_detail},
        "engine": engine,
    }
    return JsonResponse(body, status=200)
