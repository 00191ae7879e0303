"""The roles' groups (viewer, operator, admin) with the staff's permissions, and every staff
user who is not a superuser in the admin role: staff could do everything before roles, and
keeps doing it until an operator narrows it (`manage.py staff list`, `staff add USER --role`).
After each `migrate`, staff/apps.py brings the groups to staff/roles.py's permissions (the
admin's every model permission included)."""

from django.db import migrations

PERMISSIONS = {
    "view_platform": "Read the console and the admin API (no tenant's data)",
    "operate_engines": "Start, drain and stop engines; change pools and scaling",
    "cancel_batches": "Cancel a tenant's batch",
    "change_tenant_limits": "Change a tenant's quota, weight and limits",
    "change_tenant_access": (
        "Create and delete tenants; change their classes, models, fields, cache group"
    ),
    "manage_keys": "Create and revoke tenants' API keys",
    "read_tenant_data": "Read tenants' batch files and request bodies",
    "manage_staff": "Manage staff users, their roles and admin API tokens",
}
VIEWER = ["view_platform"]
OPERATOR = [*VIEWER, "operate_engines", "cancel_batches", "change_tenant_limits"]
ADMIN = [*OPERATOR, "change_tenant_access", "manage_keys", "read_tenant_data", "manage_staff"]
ROLES = {"viewer": VIEWER, "operator": OPERATOR, "admin": ADMIN}


def create_roles(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    Group = apps.get_model("auth", "Group")
    User = apps.get_model("auth", "User")
    content_type, _ = ContentType.objects.get_or_create(app_label="staff", model="access")
    perms = {
        codename: Permission.objects.get_or_create(
            content_type=content_type, codename=codename, defaults={"name": name}
        )[0]
        for codename, name in PERMISSIONS.items()
    }
    for role, codenames in ROLES.items():
        group, _ = Group.objects.get_or_create(name=role)
        group.permissions.add(*(perms[c] for c in codenames))
    admins = Group.objects.get(name="admin")
    for user in User.objects.filter(is_staff=True, is_superuser=False):
        user.groups.add(admins)


class Migration(migrations.Migration):
    dependencies = [
        ("staff", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(create_roles, migrations.RunPython.noop)]
