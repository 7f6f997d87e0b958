"""Fixtures of the dashboard's page tests: what was pushed, and a logged-in staff client."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User


@pytest.fixture
def pushed(monkeypatch):
    """What the dashboard receivers pushed: [(event, payload)]."""
    sent: list[tuple[str, dict]] = []
    monkeypatch.setattr("apps.dashboard.services.dashboard_push",
                        lambda *, event, payload: sent.append((event, payload)))
    return sent


@pytest.fixture
def operator(client):
    """The test client logged in as a staff user (an operator)."""
    client.force_login(User.objects.create_user("op", password="pw", is_staff=True))
    return client
