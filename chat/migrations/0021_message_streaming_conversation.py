# One answer at a time per conversation (issue 29): the claim of a shopper message looks up the
# conversation's streaming answers (chat.services.messages), through this partial index.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('chat', '0020_search'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='message',
            index=models.Index(condition=models.Q(('state', 'streaming')), fields=['conversation'], name='message_streaming_conversation'),
        ),
    ]
