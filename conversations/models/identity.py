"""Which identity provider account a site user is: the provider's issuer and the subject
(``sub``) it gives that person. A user signed in by the provider is found by this pair, never
by a name or an e-mail address a provider account could take over."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class ExternalIdentity(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="identities")
    issuer = models.CharField(max_length=300)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)
    last_sign_in_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="identity_unique_subject")]
        verbose_name = "external identity"
        verbose_name_plural = "external identities"

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer}"
