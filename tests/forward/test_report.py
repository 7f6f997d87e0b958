"""What a forward's report says about its holders afterwards (apps/forward/report.py). Pure."""

from __future__ import annotations

from apps.forward.report import Failure, ForwardReport, HolderStats


def test_a_holder_cools_down_when_it_failed_or_answered_nothing_not_when_one_of_its_requests_stalled() -> None:
    report = ForwardReport(
        holders={"lossy": HolderStats("lossy", batches=7), "hung": HolderStats("hung"),
                 "ok": HolderStats("ok", batches=3), "erred": HolderStats("erred", batches=2)},
        failures=[Failure("lossy", "stalled", "raced out", 0, 1, 4),  # one part of seven stalled: a lost tail
                  Failure("hung", "stalled", "raced out", 0, 2, 4),  # every batch raced out
                  Failure("erred", "timeout", "", 0, 3, 1), Failure("gone", "connection_failed", "", 0, 4, 1)])
    assert report.cooling_providers() == {"hung", "erred", "gone"}
    assert report.failed_providers == {"erred", "gone"}  # a stall is not excluded from replanning
    assert set(report.holders) == {"lossy", "hung", "ok", "erred"}  # asking made no holder entry


def test_a_holder_that_stalled_while_still_answering_is_not_cooled() -> None:
    """When a path's round trip jumps, every request to it runs past the quantile its book learnt on the
    old path: raced out on every batch, but its connection still answers. A hung one is silent."""
    report = ForwardReport(failures=[Failure("slower", "stalled", "raced out", 0, 1, 4, answering=True),
                                     Failure("slower", "stalled", "raced out", 0, 2, 4),  # the ACK came late
                                     Failure("hung", "stalled", "raced out", 0, 3, 4)])
    assert report.cooling_providers() == {"hung"}
