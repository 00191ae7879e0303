from django.apps import AppConfig


class SchedulerConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "scheduler"

    def ready(self) -> None:
        from scheduler import signals  # noqa: F401  (connects the receivers)
