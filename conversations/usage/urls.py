from django.urls import path

from conversations.usage import views

urlpatterns = [
    path("settings/usage/", views.my_usage, name="usage"),
    path("admin/usage/", views.site_usage, name="site-usage"),
]
