from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="HolderPenalty",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("provider_id", models.CharField(db_index=True, max_length=64)),
                ("reason", models.CharField(help_text="timeout, connection_failed, stalled (raced out), …",
                                            max_length=64)),
                ("message", models.TextField(blank=True)),
                ("model_id", models.CharField(max_length=200)),
                ("layer", models.PositiveIntegerField()),
                ("expert", models.PositiveIntegerField()),
                ("rows", models.PositiveIntegerField()),
                ("at", models.DateTimeField(auto_now_add=True, db_index=True)),
            ],
            options={"ordering": ("-at", "-id")},
        ),
    ]
