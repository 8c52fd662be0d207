from django.conf import settings
from django.contrib.auth import views as auth_views
from django.urls import include, path

from idp.views import DiscoveryView

t = settings.TENANT
urlpatterns = [
    # The authority is https://HOST:PORT/<tenant>; discovery lives at both Entra-style spots.
    path(f"{t}/.well-known/openid-configuration", DiscoveryView.as_view()),
    path(f"{t}/v2.0/.well-known/openid-configuration", DiscoveryView.as_view()),
    path(f"{t}/o/", include("oauth2_provider.urls", namespace="oauth2_provider")),
    path(f"{t}/accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path(f"{t}/accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
]
