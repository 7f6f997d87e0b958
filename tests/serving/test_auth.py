"""Client keys at /v1's door (apps/serving/auth.py): a key read once per web process, its requests
counted in Redis, and any change to a key (revoked, its limit edited) holding at its next request."""

import asyncio
import time

import pytest
from django.contrib.admin.sites import site
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.node.selectors import redis_client
from apps.serving import auth, services
from apps.serving.models import ClientKey
from core.errors import RateLimited, Unauthorized

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)  # the epoch is bumped on commit


@pytest.fixture(autouse=True)
def _fresh_cache():
    auth._keys.clear()
    client = redis_client()
    client.delete(services.KEYS_EPOCH, *client.keys("tenzro:v1:requests:*"))  # ids are reused between tests
    if time.time() % 60 > 58:  # the counters are per minute: do not straddle one
        time.sleep(2.1)
    yield
    auth._keys.clear()


def _admit(secret: str) -> auth.AdmittedKey:
    return asyncio.run(auth.admit(secret))


def test_a_key_is_read_once_then_admitted_from_the_cache_and_counted_each_time() -> None:
    row, secret = services.key_create(name="app", requests_per_minute=3)
    first = _admit(secret)
    assert first.id == row.id and first.requests_per_minute == 3
    with CaptureQueriesContext(connection) as queries:
        assert _admit(secret).id == row.id
        assert _admit(secret).id == row.id
    assert len(queries) == 0  # the second and third requests read no database
    with pytest.raises(RateLimited) as limited:  # the fourth this minute
        _admit(secret)
    assert limited.value.reason == "rate_limited" and 0 < limited.value.details["retry_after_s"] <= 60


def test_a_revoked_key_is_refused_at_its_next_request_though_cached() -> None:
    _, secret = services.key_create(name="app")
    _admit(secret)
    services.key_revoke(prefix=secret)
    with pytest.raises(Unauthorized) as refused:
        _admit(secret)
    assert refused.value.reason == "invalid_api_key"
    assert services.key_hash(secret) not in auth._keys


def test_a_limit_edited_in_the_admin_holds_at_the_next_request(rf, django_user_model) -> None:
    row, secret = services.key_create(name="app", requests_per_minute=100)
    assert _admit(secret).requests_per_minute == 100
    request = rf.post("/admin/")
    request.user = django_user_model(is_staff=True, is_superuser=True)
    row.requests_per_minute = 1
    site._registry[ClientKey].save_model(request, row, form=None, change=True)
    with pytest.raises(RateLimited):  # the second request of the minute, under the new limit of 1
        _admit(secret)


def test_an_unknown_key_is_refused_and_nothing_is_cached() -> None:
    with pytest.raises(Unauthorized):
        _admit("sk-tz-not-a-key")
    assert auth._keys == {}
