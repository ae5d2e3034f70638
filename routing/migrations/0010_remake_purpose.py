# Ledger purpose "remake": a clean answer re-made for the answer cache from the standalone
# question alone (routing/cache_review/remake.py; issue 29, point 2).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('routing', '0009_conversation_task'),
    ]

    operations = [
        migrations.AlterField(
            model_name='upstreamcall',
            name='purpose',
            field=models.CharField(choices=[('answer', 'Answer to a shopper'), ('tool', "Answer to a shopper, after a store tool's result"), ('rewrite', 'Follow-up rewrite (answer cache key)'), ('summary', 'Rolling conversation summary'), ('suggestion', 'Suggested reply for an agent'), ('audit', 'Answer-cache audit'), ('judge', 'Answer-cache promotion judge'), ('remake', 'Answer-cache clean remake (no shopper history)'), ('gateway', 'Gateway (/v1/chat/completions)')], db_index=True, default='answer', max_length=16),
        ),
    ]
