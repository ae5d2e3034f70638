# A bot test's conversation (issue 37: manage.py bot_test), kept out of the agents' queue, alerts,
# search, the ops figures and the budgets.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('chat', '0027_labels_canned'),
    ]

    operations = [
        migrations.AddField(
            model_name='conversation',
            name='sandbox',
            field=models.BooleanField(default=False),
        ),
    ]
