from django.apps import AppConfig


class TelemetryConfig(AppConfig):
    """The sampled history's tables keep the label they were created under, `workers`, so
    existing databases need no migration (docs/decisions/0006-packages-by-subject.md)."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "telemetry"
    label = "workers"
    verbose_name = "Telemetry"
