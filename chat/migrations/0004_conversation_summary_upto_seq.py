# Conversation.summary_upto_seq: the seq up to which the rolling summary reaches (routing/context.py).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('chat', '0003_message_cache_entry_id'),
    ]

    operations = [
        migrations.AddField(
            model_name='conversation',
            name='summary_upto_seq',
            field=models.PositiveIntegerField(default=0),
        ),
    ]
