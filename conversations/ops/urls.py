"""Operations endpoints: health probes and Prometheus metrics."""

from django.urls import path

from conversations.ops import metrics, views

urlpatterns = [
    path("health", views.health, name="health"),
    path("healthz", views.healthz, name="healthz"),
    path("livez", views.livez, name="livez"),
    path("metrics", metrics.metrics, name="metrics"),
]
