from django.contrib import admin
from django.urls import include, path

from conversations.accounts.login_throttle import throttled
from conversations.api import key_pages as api_views
from conversations.api.app import api as openai_api
from conversations.chat import views
from conversations.ops import metrics

urlpatterns = [
    path("", views.home, name="home"),
    path("healthz", views.healthz, name="healthz"),
    path("livez", views.livez, name="livez"),
    path("metrics", metrics.metrics, name="metrics"),
    path("accounts/signup/", views.signup, name="signup"),
    path("accounts/login/", throttled(views.LoginView.as_view()), name="login"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/login/", throttled(admin.site.login)),
    path("admin/", admin.site.urls),
    path("v1/", openai_api.urls),
    path("v1/<path:path>", api_views.api_not_found),
    path("settings/api-keys/", api_views.api_keys, name="api_keys"),
    path("settings/api-keys/<int:key_id>/revoke/", api_views.revoke_api_key, name="api_key_revoke"),
    path("", include("conversations.urls")),
]
