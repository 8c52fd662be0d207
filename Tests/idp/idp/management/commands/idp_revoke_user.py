"""Revoke everything a user holds: refresh tokens, access tokens, id tokens, codes, sessions.

Simulates an administrator revoking a user's sessions."""
from django.contrib.auth.models import User
from django.contrib.sessions.models import Session
from django.core.management.base import BaseCommand, CommandError
from oauth2_provider.models import AccessToken, Grant, IDToken, RefreshToken


class Command(BaseCommand):
    help = "Revoke all tokens and sessions of USERNAME."

    def add_arguments(self, parser):
        parser.add_argument("username")

    def handle(self, *args, username, **options):
        try:
            user = User.objects.get(username=username)
        except User.DoesNotExist:
            raise CommandError(f"no such user: {username}")
        refresh = 0
        for rt in RefreshToken.objects.filter(user=user, revoked__isnull=True):
            rt.revoke()  # marks it revoked and deletes its access token
            refresh += 1
        access, _ = AccessToken.objects.filter(user=user).delete()
        IDToken.objects.filter(user=user).delete()
        Grant.objects.filter(user=user).delete()
        sessions = 0
        for s in Session.objects.all():
            if s.get_decoded().get("_auth_user_id") == str(user.pk):
                s.delete()
                sessions += 1
        self.stdout.write(
            f"revoked {refresh} refresh tokens, deleted {access} more access tokens, {sessions} sessions"
        )
