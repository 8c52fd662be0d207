"""Print the IdP's refresh and access tokens as JSON (metadata only, never token values)."""
import json

from django.core.management.base import BaseCommand
from oauth2_provider.models import AccessToken, RefreshToken


def _user(t):
    return t.user.username if t.user else None


def _client(t):
    return t.application.client_id if t.application else None


class Command(BaseCommand):
    help = "List refresh tokens (user, client_id, revoked, created) and access tokens as JSON."

    def handle(self, *args, **options):
        data = {
            "refresh_tokens": [
                {
                    "id": t.pk,
                    "user": _user(t),
                    "client_id": _client(t),
                    "revoked": t.revoked is not None,
                    "created": t.created.isoformat(),
                }
                for t in RefreshToken.objects.select_related("user", "application").order_by("pk")
            ],
            "access_tokens": [
                {
                    "id": t.pk,
                    "user": _user(t),
                    "client_id": _client(t),
                    "expires": t.expires.isoformat(),
                    "expires_at": t.expires.timestamp(),
                }
                for t in AccessToken.objects.select_related("user", "application").order_by("pk")
            ],
        }
        self.stdout.write(json.dumps(data, indent=1))
