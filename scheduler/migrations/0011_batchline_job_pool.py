from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler", "0010_adapters"),
    ]

    operations = [
        migrations.AddField(
            model_name="batchline",
            name="job_pool",
            field=models.CharField(
                blank=True, help_text="The fair-queue pool its current job is in.", max_length=255
            ),
        ),
    ]
