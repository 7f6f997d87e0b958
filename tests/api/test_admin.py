"""The admin as an operator reads it: every model named in plain English, the worker's published
state listed read-only."""

from __future__ import annotations

import re

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.auth.models import User
from django.utils import timezone

from apps.api.read_only_admin import ReadOnlyAdmin
from apps.worker import services
from apps.worker.models import HeldExpert, HeldGate, WorkerState

# Django's default plural only appends "s": "Holder penaltys", "Repair passs", "Trim watchs".
_NAIVE_PLURAL = re.compile(r"([^aeiou]ys|ss|[cs]hs|xs)$")


def test_every_model_has_an_english_plural() -> None:
    named = {f"{m._meta.app_label}.{m.__name__}": str(m._meta.verbose_name_plural) for m in apps.get_models()
             if m._meta.app_label not in {"auth", "admin", "contenttypes", "sessions"}}
    assert named and not {k: v for k, v in named.items() if _NAIVE_PLURAL.search(v)}


def test_the_worker_state_is_in_the_admin_read_only() -> None:
    for model in (WorkerState, HeldExpert, HeldGate):
        assert isinstance(admin.site._registry[model], ReadOnlyAdmin), model


@pytest.mark.django_db
def test_worker_state_pages_list_the_published_rows(client) -> None:
    status = {"experts": [{"model_id": "tiny-moe", "layer": 0, "expert": 3, "tier": "memory", "memory_bytes": 100,
                           "disk_bytes": 50, "d_model": 8, "d_ff": 4, "formats": {"gate_proj": "Q8_0"},
                           "blob_uri": None}],
              "gates": [], "memory_budget_bytes": 1000, "memory_used_bytes": 200, "committed_tps": 42,
              "capacity_tps": 9000, "demand": [], "backend": "cpu", "cpu_kernel": "c-avx2",
              "gpu_backend_active": False}
    services.worker_state_publish(provider_id="ab" * 32, pid=4242, started_at=timezone.now(), status=status)
    User.objects.create_superuser("root", "root@example.com", "pw")
    client.login(username="root", password="pw")
    index = client.get("/admin/").content.decode()
    assert "Worker state" in index and "Held experts" in index and "Holder penalties" in index
    assert "tiny-moe" in client.get("/admin/worker/heldexpert/").content.decode()
    state = client.get("/admin/worker/workerstate/").content.decode()
    assert "4242" in state and "c-avx2" in state
    assert client.get("/admin/worker/heldexpert/add/").status_code == 403
    row = HeldExpert.objects.get()
    assert 'name="_save"' not in client.get(f"/admin/worker/heldexpert/{row.pk}/change/").content.decode()
