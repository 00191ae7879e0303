from typing import Any

from django.apps import AppConfig, apps
from django.db.models.signals import post_migrate


class StaffConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "staff"

    def ready(self) -> None:
        post_migrate.connect(_sync_roles, dispatch_uid="staff.sync_roles")


def _sync_roles(sender: AppConfig, using: str = "default", **kwargs: Any) -> None:
    """After every `migrate` (and a test database's flush), each role's group holds exactly
    the permissions staff/roles.py gives it, those of models added since the data migration
    included. `post_migrate` is sent once per app, and each app's permissions are made on
    its own sending (of the apps with models): the last one's is when every permission
    exists."""
    with_models = [config for config in apps.get_app_configs() if config.models_module]
    if sender is not with_models[-1]:
        return
    from staff.roles import sync_role_groups

    sync_role_groups(using=using)
