"""The site's URLs: each part of ``conversations`` serves its own, plus Django's admin."""

from django.contrib import admin
from django.urls import include, path

from conversations.accounts.views import admin_login

urlpatterns = [
    # First: every API call resolves its path, and Django tries the patterns in order.
    path("", include("conversations.api.urls")),
    path("", include("conversations.chat.urls")),
    path("", include("conversations.workspace.urls")),
    path("", include("conversations.ops.urls")),
    path("accounts/", include("conversations.accounts.urls")),
    # Before the admin's own login page: the same throttle as the site's, and off with local sign-in.
    path("admin/login/", admin_login),
    path("", include("conversations.usage.urls")),  # /admin/usage/ before the admin's own pages
    path("admin/", admin.site.urls),
    path("", include("conversations.transfer.urls")),
    path("", include("conversations.documents.urls")),
]

handler404 = "conversations.error_pages.page_not_found"
handler403 = "conversations.error_pages.permission_denied"
handler500 = "conversations.error_pages.server_error"
