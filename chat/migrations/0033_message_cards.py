from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0025_assignment"),
    ]

    operations = [
        migrations.AddField(
            model_name="message",
            name="cards",
            field=models.JSONField(blank=True, default=list),
        ),
    ]
