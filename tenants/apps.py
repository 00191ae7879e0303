from django.apps import AppConfig


class TenantsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "tenants"

    def ready(self) -> None:
        from tenants import signals  # noqa: F401  (connects the receivers)
