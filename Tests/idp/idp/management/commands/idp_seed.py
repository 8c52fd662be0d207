"""Idempotently create the test users and OAuth applications."""
from django.contrib.auth.models import User
from django.core.management.base import BaseCommand
from oauth2_provider.models import Application

USERS = [
    ("alice", "alice-pw", "Alice", "Liddell", "alice@example.test"),
    ("bob", "bob-pw", "Bob", "Builder", "bob@example.test"),
]
# Loopback redirect URIs: any port is accepted (RFC 8252 section 7.3, ALLOW_LOCALHOST_LOOPBACK),
# but the path must match exactly, so register both "/" and the empty path.
LOOPBACK = " ".join(
    f"http://{host}{path}" for host in ("127.0.0.1", "localhost", "[::1]") for path in ("/", "")
)
AUTH_CODE = Application.GRANT_AUTHORIZATION_CODE
DEVICE = Application.GRANT_DEVICE_CODE
APPS = [  # client_id, grant type, skip consent screen
    ("tessera-test", AUTH_CODE, True),
    ("tessera-other", AUTH_CODE, True),
    ("tessera-short", AUTH_CODE, True),  # access tokens live 3 s (idp/lifetimes.py)
    ("tessera-soak", AUTH_CODE, True),  # access tokens live 2 minutes (the fault suite's soak)
    ("tessera-consent", AUTH_CODE, False),  # shows the consent screen
    ("tessera-device", DEVICE, True),  # DOT allows one grant type per application
]
# Confidential clients (a [[provider]] with a client secret): client_id, grant type, secret.
CONFIDENTIAL = [
    ("tessera-confidential", AUTH_CODE, "conf-secret-1"),
    # oidc-agent, the peer the benchmark compares with (scripts/bench), set up without a browser
    # by its password flow (oidc-gen --flow=password).
    ("tessera-oidc-agent", Application.GRANT_PASSWORD, "agent-secret-1"),
]


class Command(BaseCommand):
    help = "Create/refresh the Tessera test users and applications."

    def handle(self, *args, **options):
        for username, password, first, last, email in USERS:
            user, _ = User.objects.get_or_create(username=username)
            user.first_name, user.last_name, user.email = first, last, email
            user.set_password(password)
            user.save()
        apps = [(client_id, grant, skip, "") for client_id, grant, skip in APPS]
        apps += [(client_id, grant, True, secret) for client_id, grant, secret in CONFIDENTIAL]
        for client_id, grant, skip, secret in apps:
            Application.objects.update_or_create(
                client_id=client_id,
                defaults=dict(
                    name=client_id,
                    client_type=Application.CLIENT_CONFIDENTIAL if secret else Application.CLIENT_PUBLIC,
                    client_secret=secret,  # DOT stores it hashed
                    authorization_grant_type=grant,
                    redirect_uris=LOOPBACK if grant == AUTH_CODE else "",
                    skip_authorization=skip,
                    algorithm=Application.RS256_ALGORITHM,
                ),
            )
        self.stdout.write(f"seeded {len(USERS)} users, {len(APPS) + len(CONFIDENTIAL)} applications")
