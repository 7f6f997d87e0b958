"""Prepare jobs scale out to Celery workers on other hosts (docs/operations.md, "Running a network
across machines"): they travel on their own queue, and a worker starting on one host clears only
the stale locks of its own host."""

import json
import socket

import pytest
from celery import current_app

from apps.catalog import services
from apps.catalog.models import JobState, PrepareJob
from apps.node.selectors import redis_client
from core.env import PREPARE_QUEUE

pytestmark = pytest.mark.django_db


def test_prepare_jobs_are_routed_to_their_own_queue() -> None:
    route = current_app.amqp.router.route({}, services.PREPARE_TASK)
    assert route["queue"].name == PREPARE_QUEUE == "prepare"
    assert current_app.amqp.router.route({}, "tenzro.providers.gossip_round")["queue"].name == "celery"


def test_a_starting_worker_clears_its_own_hosts_stale_locks_only_and_requeues_on_the_prepare_queue() -> None:
    jobs = [PrepareJob.objects.create(model_id="m", layer=0, experts=[0], quant="q8_0", checkpoint="/c",
                                      state=JobState.RUNNING) for _ in range(2)]
    here, there = (services.LOCK_KEY.format(job_id=str(job.pk)) for job in jobs)
    client = redis_client()
    client.delete(PREPARE_QUEUE)  # the broker's list of the queue (Celery's Redis transport)
    client.set(here, f"{socket.gethostname()}/dead-worker", ex=60)
    client.set(there, "prepare-host-2/busy-worker", ex=60)
    try:
        assert sorted(services.prepare_jobs_resume()) == sorted(str(j.pk) for j in jobs)
        assert client.get(here) is None and client.get(there) == b"prepare-host-2/busy-worker"  # one unlocked
        queued = [json.loads(m) for m in client.lrange(PREPARE_QUEUE, 0, -1)]  # both requeued, on the queue
        assert sorted(m["headers"]["argsrepr"] for m in queued) == sorted(f"['{j.pk}']" for j in jobs)
        assert {m["headers"]["task"] for m in queued} == {services.PREPARE_TASK}
    finally:
        client.delete(here, there, PREPARE_QUEUE)
