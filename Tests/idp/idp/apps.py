from django.apps import AppConfig


class IdpConfig(AppConfig):
    name = "idp"
    default_auto_field = "django.db.models.AutoField"
