"""A /v1 client that leaves cancels its generation (apps/serving/v1.py): a cancel that cannot reach the
expert worker is said in the log, never dropped in silence."""

import asyncio
import logging

from apps.node.selectors import redis_client
from apps.serving import v1
from apps.worker import mailbox
from apps.worker.client import WORKER_CALLS


def test_a_cancel_the_worker_does_not_answer_is_logged_with_its_generation(settings, caplog) -> None:
    settings.TENZRO_WORKER_TIMEOUT_S = 0.2  # no expert worker takes this test's calls
    redis_client().delete(WORKER_CALLS)
    with caplog.at_level(logging.WARNING, logger="tenzro.serving"):
        asyncio.run(v1._cancel("0123abcd"))
    call = asyncio.run(mailbox.take(WORKER_CALLS, 0.1))
    assert call is not None and call["method"] == "moe/generation_cancel"
    assert call["params"] == {"generation_id": "0123abcd"}
    [warning] = [r for r in caplog.records if r.name == "tenzro.serving"]
    assert "0123abcd" in warning.getMessage() and "did not reach the expert worker" in warning.getMessage()
    assert "did not answer moe/generation_cancel within 0.2 s" in warning.getMessage()
