"""Generation records: steps appended in order, a worker stop's leftovers closed, the newest kept."""

from __future__ import annotations

import asyncio
import threading

import pytest
from django.test import override_settings

from apps.generation import selectors, services
from apps.generation.models import Generation
from apps.generation.records import RecordWriter

pytestmark = pytest.mark.django_db


def _start(gid: str, running: set[str] = frozenset()) -> None:
    services.generation_start(generation_id=gid, model_id="m", prompt_ids=[1, 2], max_new_tokens=3,
                              options={"wire": "f32"}, running=running)


def test_steps_accumulate_tokens_and_the_first_sets_ttft() -> None:
    _start("g1")
    services.generation_step(generation_id="g1", step={"index": 0, "token": 7}, ttft_ms=12.5)
    services.generation_step(generation_id="g1", step={"index": 1, "token": 9})
    services.generation_finish(generation_id="g1", decode_tokens_per_s=4.0)
    record = selectors.generation_get(generation_id="g1")
    assert record["tokens"] == [7, 9] and [s["index"] for s in record["steps"]] == [0, 1]
    assert record["ttft_ms"] == 12.5 and record["state"] == "done" and record["error"] is None


def test_steps_written_in_a_batch_keep_their_order_in_one_query_set(django_assert_max_num_queries) -> None:
    _start("g1")
    services.generation_steps(generation_id="g1", steps=[{"index": 0, "token": 7}], ttft_ms=3.0)
    with django_assert_max_num_queries(6):  # the same few queries for 5 steps as for 1
        services.generation_steps(generation_id="g1", steps=[{"index": i, "token": 10 + i} for i in range(1, 6)])
    services.generation_steps(generation_id="g1", steps=[])  # nothing to write: nothing written
    record = selectors.generation_get(generation_id="g1")
    assert record["tokens"] == [7, 11, 12, 13, 14, 15] and [s["index"] for s in record["steps"]] == list(range(6))
    assert record["ttft_ms"] == 3.0


def test_many_generations_steps_go_in_one_transaction_of_the_same_few_queries(django_assert_max_num_queries) -> None:
    for gid in ("g1", "g2", "g3", "g4"):
        _start(gid)
    services.generation_steps_many(batches=[("g1", [{"index": 0, "token": 7}], 2.0)])
    with django_assert_max_num_queries(8):  # 4 generations' steps: the queries of one, not four times them
        services.generation_steps_many(batches=[
            ("g1", [{"index": 1, "token": 8}], None), ("g2", [{"index": 0, "token": 5}, {"index": 1, "token": 6}], 4.0),
            ("g3", [{"index": 0, "token": 1, "text": "a"}], 1.0), ("g4", [{"index": 0, "token": 2}], 1.5),
            ("gone", [{"index": 0, "token": 3}], 1.0)])  # deleted while it ran: skipped, the others written
    records = {gid: selectors.generation_get(generation_id=gid) for gid in ("g1", "g2", "g3", "g4")}
    assert [records[g]["tokens"] for g in ("g1", "g2", "g3", "g4")] == [[7, 8], [5, 6], [1], [2]]
    assert records["g1"]["ttft_ms"] == 2.0 and records["g2"]["ttft_ms"] == 4.0 and records["g3"]["text"] == "a"
    assert [s["index"] for s in records["g2"]["steps"]] == [0, 1]


def test_a_failure_keeps_the_tokens_so_far_and_names_the_reason() -> None:
    _start("g1")
    services.generation_step(generation_id="g1", step={"index": 0, "token": 7}, ttft_ms=1.0)
    services.generation_finish(generation_id="g1", error_reason="forward_incomplete", error_message="expert 3 lost")
    record = selectors.generation_get(generation_id="g1")
    assert record["state"] == "failed" and record["tokens"] == [7]
    assert record["error"] == {"reason": "forward_incomplete", "message": "expert 3 lost"}


def test_a_generation_cut_off_by_a_worker_stop_is_closed_when_the_next_starts() -> None:
    _start("old")
    _start("alive", running={"old"})  # still running in this worker: left alone
    assert Generation.objects.get(generation_id="old").state == "running"
    _start("new", running={"alive"})  # the worker restarted: "old" is no longer its own
    old = selectors.generation_get(generation_id="old")
    assert old["state"] == "failed" and old["error"]["reason"] == "interrupted"
    assert Generation.objects.get(generation_id="alive").state == "running"


def test_a_worker_start_closes_what_the_last_one_ran_and_names_their_streams() -> None:
    services.generation_start(generation_id="streamed", model_id="m", prompt_ids=[1], max_new_tokens=3,
                              options={"stream": "v1-abc"})
    services.generation_step(generation_id="streamed", step={"index": 0, "token": 7}, ttft_ms=1.0)
    _start("ids-only", running={"streamed"})
    _start("done", running={"streamed", "ids-only"})
    services.generation_finish(generation_id="done", finish_reason="length")
    closed = services.generations_interrupted()
    assert sorted(closed, key=lambda c: c["generation_id"]) == [
        {"generation_id": "ids-only", "stream": None, "tokens": 0},
        {"generation_id": "streamed", "stream": "v1-abc", "tokens": 1}]
    streamed = selectors.generation_get(generation_id="streamed")
    assert streamed["state"] == "failed" and streamed["finish_reason"] == "error" and streamed["tokens"] == [7]
    assert streamed["error"]["reason"] == "interrupted"
    assert selectors.generation_get(generation_id="done")["state"] == "done"
    assert services.generations_interrupted() == []  # nothing left running


def test_the_dense_parts_a_router_loaded_are_remembered_once_each() -> None:
    services.dense_loaded(model_id="m", checkpoint="/a", dense_bytes=10)
    services.dense_loaded(model_id="m", checkpoint="/b", dense_bytes=12)  # loaded again from elsewhere
    services.dense_loaded(model_id="n", checkpoint="hub:x/y", dense_bytes=5)
    assert selectors.dense_loaded_list() == [{"model_id": "m", "checkpoint": "/b", "dense_bytes": 12},
                                             {"model_id": "n", "checkpoint": "hub:x/y", "dense_bytes": 5}]


@override_settings(TENZRO_GENERATIONS_KEPT=2)
def test_only_the_newest_records_are_kept_and_unknown_ids_are_named() -> None:
    for gid in ("a", "b", "c"):
        _start(gid, running={"a", "b", "c"})
    assert [g["generation_id"] for g in selectors.generations_recent()] == ["c", "b"]
    with pytest.raises(Exception, match="no generation 'a'"):
        selectors.generation_get(generation_id="a")


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_the_record_writer_never_carries_steps_ahead_of_their_records_creation() -> None:
    """apps/generation/records.py: steps are coalesced into one job, but a generation's first steps never
    ride in a job queued before its record was created (they would find no record and be lost)."""
    gate = threading.Event()

    def start(gid: str) -> None:
        services.generation_start(generation_id=gid, model_id="m", prompt_ids=[1], max_new_tokens=3, options={},
                                  running={"a", "b"})

    async def scenario():
        writer = RecordWriter()
        writer.write(gate.wait, timeout=10)  # the database thread busy: everything below queues up behind it
        writer.write(start, gid="a")
        writer.steps(generation_id="a", steps=[{"index": 0, "token": 7}], ttft_ms=1.0)
        writer.write(start, gid="b")  # created after a's steps job was queued
        writer.steps(generation_id="b", steps=[{"index": 0, "token": 5}], ttft_ms=1.0)
        writer.steps(generation_id="a", steps=[{"index": 1, "token": 8}])
        last = writer.write(services.generation_finish, generation_id="a", finish_reason="length")
        gate.set()
        await last

    asyncio.run(scenario())
    assert selectors.generation_get(generation_id="a")["tokens"] == [7, 8]
    assert selectors.generation_get(generation_id="b")["tokens"] == [5]
