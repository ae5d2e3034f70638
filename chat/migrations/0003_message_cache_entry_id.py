# Message.cache_entry_id: the CachedAnswer a cache.* bot answer was served from (no foreign key).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('chat', '0002_agent_console'),
    ]

    operations = [
        migrations.AddField(
            model_name='message',
            name='cache_entry_id',
            field=models.BigIntegerField(blank=True, null=True),
        ),
    ]
