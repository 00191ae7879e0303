"""The admin API's tokens of DRF's authtoken (stored raw) become digests: each raw token's
SHA-256 goes into staff_admintoken, named `authtoken`, so scripts that hold one keep working,
and the raw table is dropped. A backup taken before this migration still holds the raw
tokens: where one may have leaked, revoke them (`manage.py staff token list`, `staff token
revoke ID`) and mint new ones (`staff token create USER`)."""

import hashlib
from datetime import UTC, datetime

from django.db import migrations
from django.utils.dateparse import parse_datetime

RAW_TABLE = "authtoken_token"


def digest_raw_tokens(apps, schema_editor):
    connection = schema_editor.connection
    if RAW_TABLE not in connection.introspection.table_names():
        return
    AdminToken = apps.get_model("staff", "AdminToken")
    ContentType = apps.get_model("contenttypes", "ContentType")
    table = connection.ops.quote_name(RAW_TABLE)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {connection.ops.quote_name('key')}, user_id, created FROM {table}")
        rows = cursor.fetchall()
    for raw, user_id, created in rows:
        token = AdminToken.objects.create(
            user_id=user_id,
            name="authtoken",
            prefix=raw[:8],
            hashed_key=hashlib.sha256(raw.encode("utf-8")).hexdigest(),
        )
        AdminToken.objects.filter(pk=token.pk).update(created_at=_aware(created))
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE {table}")
        cursor.execute("DELETE FROM django_migrations WHERE app = %s", ["authtoken"])
    # The app's permissions go with its content types (the roles' groups held them).
    ContentType.objects.filter(app_label="authtoken").delete()


def _aware(created):
    """A timestamp as the database returns it (SQLite: naive UTC, or text) made aware."""
    moment = parse_datetime(created) if isinstance(created, str) else created
    if isinstance(moment, datetime) and moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment


class Migration(migrations.Migration):
    dependencies = [("staff", "0002_roles")]

    # Backwards there is nothing to restore: the raw tokens are nowhere any more.
    operations = [migrations.RunPython(digest_raw_tokens, migrations.RunPython.noop)]
