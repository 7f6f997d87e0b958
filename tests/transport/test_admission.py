"""Peer admission (sans-I/O): streams in flight and the token bucket, with an explicit clock."""

import pytest

from apps.transport.admission import PeerAdmission, PeerLimits


def test_streams_in_flight_are_capped_and_released() -> None:
    admission = PeerAdmission(PeerLimits(max_body=1, max_streams=2, rate_per_s=1000, burst=1000), now=0.0)
    assert admission.admit(0.0) is None and admission.admit(0.0) is None
    refusal = admission.admit(0.0)
    assert refusal is not None and refusal.reason == "too_many_streams" and "2 requests" in refusal.message
    admission.release()
    assert admission.admit(0.0) is None
    assert admission.in_flight == 2 and admission.refused == 1


def test_rate_limit_refills_at_the_configured_rate() -> None:
    admission = PeerAdmission(PeerLimits(max_body=1, max_streams=100, rate_per_s=10, burst=3), now=0.0)
    for _ in range(3):
        assert admission.admit(0.0) is None
        admission.release()
    refusal = admission.admit(0.0)
    assert refusal is not None and refusal.reason == "rate_limited" and "retry in 0.100 s" in refusal.message
    assert admission.admit(0.05) is not None  # half a token
    assert admission.admit(0.2) is None  # refilled
    admission.release()
    # the bucket never holds more than the burst, however long the peer was quiet
    for _ in range(3):
        assert admission.admit(1000.0) is None
        admission.release()
    assert admission.admit(1000.0).reason == "rate_limited"


def test_release_without_admit_is_a_bug() -> None:
    with pytest.raises(RuntimeError):
        PeerAdmission(PeerLimits(max_body=1), now=0.0).release()
