from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('scheduler', '0008_pool_targets'),
    ]

    operations = [
        migrations.CreateModel(
            name='PoolReservation',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('pool', models.CharField(max_length=300, unique=True)),
                ('mode', models.CharField(choices=[('predict', 'predict'), ('worst', 'worst case')], max_length=16)),
                ('updated_at', models.DateTimeField(auto_now=True)),
            ],
            options={
                'ordering': ('pool',),
            },
        ),
    ]
