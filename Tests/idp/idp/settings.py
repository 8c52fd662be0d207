"""Settings for Tessera's test identity provider: django-oauth-toolkit as an OIDC provider.

Everything instance-specific comes from the environment (written by scripts/idp start):
  TESSERA_IDP_DIR        state dir (sqlite DB, OIDC key)
  TESSERA_IDP_URL        https://127.0.0.1:PORT  (origin; the issuer is URL + /TENANT)
  TESSERA_IDP_TENANT     tenant GUID (first path segment), default below
  TESSERA_IDP_OIDC_KEY   PEM file with the RS256 signing key (default DIR/oidc-key.pem)
  TESSERA_IDP_LOG        request log (JSON lines), optional
  TESSERA_IDP_HOSTNAMES  DNS names the IdP also answers to (space-separated; scripts/msal-session)
  TESSERA_IDP_DEVICE_INTERVAL  device-flow polling interval in seconds (default 1)
"""
import os
from pathlib import Path

from idp.lifetimes import access_token_expires_in

STATE_DIR = Path(os.environ.get("TESSERA_IDP_DIR", "/tmp/tessera-idp"))
IDP_URL = os.environ.get("TESSERA_IDP_URL", "https://127.0.0.1:8443").rstrip("/")
TENANT = os.environ.get("TESSERA_IDP_TENANT", "6f1c2a4e-0000-4000-8000-000000000001")
ISSUER = f"{IDP_URL}/{TENANT}"  # == the authority; no trailing slash

_key_file = Path(os.environ.get("TESSERA_IDP_OIDC_KEY", STATE_DIR / "oidc-key.pem"))
OIDC_KEY = _key_file.read_text() if _key_file.exists() else ""

SECRET_KEY = "tessera-test-idp-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]", *os.environ.get("TESSERA_IDP_HOSTNAMES", "").split()]
USE_TZ = True
TIME_ZONE = "UTC"

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "oauth2_provider",
    "idp",
]
MIDDLEWARE = [
    "idp.middleware.RequestLogMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "idp.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": STATE_DIR / "db.sqlite3",
        # gunicorn runs 8 threads: wait for locks, take the write lock up front.
        "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE"},
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins in tests
STATIC_URL = "/static/"
LOGIN_URL = f"/{TENANT}/accounts/login/"
LOGIN_REDIRECT_URL = f"/{TENANT}/accounts/login/"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}

OAUTH2_PROVIDER = {
    "OIDC_ENABLED": True,
    "OIDC_ISS_ENDPOINT": ISSUER,
    "OIDC_RSA_PRIVATE_KEY": OIDC_KEY,
    "OIDC_RP_INITIATED_LOGOUT_ENABLED": True,
    "OIDC_TOKEN_ENDPOINT_AUTH_METHODS_SUPPORTED": ["none", "client_secret_post", "client_secret_basic"],
    "OAUTH2_VALIDATOR_CLASS": "idp.validators.TesseraValidator",
    "SCOPES": {
        "openid": "OpenID Connect",
        "profile": "Your name and username",
        "email": "Your email address",
        "offline_access": "Stay signed in (refresh tokens)",
        "read": "Read access",
        "write": "Write access",
    },
    "DEFAULT_SCOPES": ["openid"],
    "PKCE_REQUIRED": True,
    "COMPLIANT_BCP_RFC9700_PKCE_METHOD": True,  # S256 only
    # RFC 8252 section 7.3: any port on http://127.0.0.1 / [::1]; this also treats localhost as loopback.
    "ALLOW_LOCALHOST_LOOPBACK": True,
    "ROTATE_REFRESH_TOKEN": True,
    "REFRESH_TOKEN_REUSE_PROTECTION": True,
    "REFRESH_TOKEN_GRACE_PERIOD_SECONDS": int(os.environ.get("TESSERA_IDP_GRACE_SECONDS", "0")),
    # A callable: oauthlib evaluates it per token request (see idp/lifetimes.py).
    "ACCESS_TOKEN_EXPIRE_SECONDS": access_token_expires_in,
    "ID_TOKEN_EXPIRE_SECONDS": 3600,
    "AUTHORIZATION_CODE_EXPIRE_SECONDS": 120,
    "DEVICE_FLOW_INTERVAL": int(os.environ.get("TESSERA_IDP_DEVICE_INTERVAL", "1")),
    "OAUTH_DEVICE_VERIFICATION_URI": f"{ISSUER}/o/device/",
    "OAUTH_DEVICE_VERIFICATION_URI_COMPLETE": f"{ISSUER}/o/device/?user_code={{user_code}}",
}
