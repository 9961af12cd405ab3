from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("conversations", "0014_multimodel_models"),
    ]

    operations = [
        migrations.AddField(
            model_name="message",
            name="side_by_side",
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name="message",
            name="side_by_side_kept",
            field=models.BooleanField(default=False),
        ),
    ]
