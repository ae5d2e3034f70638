from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0021_message_streaming_conversation"),
    ]

    operations = [
        migrations.AddField(
            model_name="conversation",
            name="complaint_at_seq",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="conversation",
            name="complaint_kind",
            field=models.CharField(blank=True, max_length=8),
        ),
        migrations.AddField(
            model_name="conversation",
            name="complaint_question",
            field=models.TextField(blank=True),
        ),
    ]
