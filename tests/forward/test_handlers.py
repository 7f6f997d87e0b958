"""The distributed forward's per-view caches: what every layer of a decode step reads is built once per
gossip view, not once per layer."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor

from apps.forward.handlers import DistributedForward
from apps.worker.doors import WorkerParts
from core.experts.runtime import ExpertRuntime
from testkit.shard_views import provider, provider_id


def test_the_ledgers_prices_are_read_once_per_view(tmp_path) -> None:
    with ThreadPoolExecutor(1) as executor:
        forward = DistributedForward(WorkerParts(ExpertRuntime(data_dir=tmp_path), executor, "ab" * 32,
                                                 control_plane=None))
    providers = [dataclasses.replace(provider(i), price_per_input_token=f"0.{i}") for i in range(1, 4)]
    view = (providers, [], None, 1)
    prices = forward.prices_of(view)
    assert prices == {provider_id(i): f"0.{i}" for i in range(1, 4)}
    assert forward.prices_of(view) is prices  # the same view: not built again
    changed = [dataclasses.replace(providers[0], price_per_input_token="0.9"), *providers[1:]]
    assert forward.prices_of((changed, [], None, 1))[provider_id(1)] == "0.9"  # a new view: its own prices


def test_the_http_client_is_made_at_the_first_holder_called_over_http(tmp_path) -> None:
    """Making it loads the certificate authorities (tens of milliseconds): not on the first forward's way
    when every holder has a pinned QUIC door."""
    with ThreadPoolExecutor(1) as executor:
        forward = DistributedForward(WorkerParts(ExpertRuntime(data_dir=tmp_path), executor, "ab" * 32,
                                                 control_plane=None))
    assert forward._quic_pool() is forward._quic_pool() and forward._http is None
    client = forward._http_client()
    assert forward._http_client() is client
