from django.http import JsonResponse
import json

from oauth2_provider.views import ConnectDiscoveryInfoView


class DiscoveryView(ConnectDiscoveryInfoView):
    """DOT's OIDC discovery document plus the endpoints it leaves out."""

    def get(self, request, *args, **kwargs):
        data = json.loads(super().get(request, *args, **kwargs).content)
        for key, name in [
            ("device_authorization_endpoint", "device-authorization"),
            ("revocation_endpoint", "revoke-token"),
            ("introspection_endpoint", "introspect"),
        ]:
            data[key] = self._get_endpoint_url(request, name, required=True)
        data["grant_types_supported"] = [
            "authorization_code",
            "refresh_token",
            "urn:ietf:params:oauth:grant-type:device_code",
        ]
        data["revocation_endpoint_auth_methods_supported"] = ["none"]
        return JsonResponse(data, headers={"Access-Control-Allow-Origin": "*"})
