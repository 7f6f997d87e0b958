"""Seed the active policy with the defaults of docs/specification.md, "Replication policy" (the network's genesis values).

min_replication 2, max_replication 8, hot_threshold_tps 1000, repair every 120 s with at
most 2 experts per pass, 1 in 64 receipts persisted. The penalty and settlement-share
values are this project's starting points; governance changes them by proposal.
"""

from django.db import migrations

GENESIS = {
    "min_replication": 2,
    "max_replication": 8,
    "hot_threshold_tps": 1000.0,
    "repair_interval_s": 120,
    "repair_max_experts_per_pass": 2,
    "receipt_sample_one_in": 64,
    "holder_failure_penalty": 1.0,
    "fraud_penalty": 100.0,
    "settlement_holder_share": 0.9,
}


def seed(apps, schema_editor):
    Policy = apps.get_model("governance", "Policy")
    if not Policy.objects.filter(status="active").exists():
        Policy.objects.create(status="active", note="genesis policy (docs/specification.md defaults)",
                              proposed_by="genesis", decided_by="genesis", **GENESIS)


class Migration(migrations.Migration):
    dependencies = [("governance", "0001_initial")]
    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
