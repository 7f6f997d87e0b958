"""Server-side render time of the dashboard's shard map page on a large view.

    python -m bench.dashboard [--providers 1000] [--layers 48] [--experts 128] [--repeat 20]

Builds a throwaway SQLite database (a temp TENZRO_DATA_DIR, migrated here) holding
``--providers`` providers and a layers x experts map of one model, each expert held by 2 to 4
providers (some hot), then times, in the same run:

  page           GET /shardmap/?model=… through Django's test client (middleware, selectors,
                 template, the embedded JSON the heatmap is drawn from); target < 300 ms
  data.json      GET of the JSON the page refetches on a shardmap.changed event
  selectors      the reads alone (apps.dashboard.selectors_shards.shardmap_grid)
  empty page     the reference: dashboard/base.html rendered with nothing in it

and counts the page's queries. Prints a table and writes bench/results/dashboard.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np

from bench.report import headline, print_table, write_results

MODEL = "bench/moe-dashboard"
TARGET_MS = 300.0


def _setup_django() -> None:
    os.environ["TENZRO_DATA_DIR"] = tempfile.mkdtemp(prefix="tenzro-bench-dashboard-")
    os.environ.pop("DATABASE_URL", None)  # the temp dir's SQLite file, never a configured database
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tenzro_site.settings.test")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def _fill(n_providers: int, n_layers: int, n_experts: int, seed: int = 0) -> int:
    from apps.providers.models import Holding, Provider

    rng = np.random.default_rng(seed)
    Provider.objects.bulk_create([
        Provider(provider_id=f"{i:064x}", seq=1, issued_at_ms=1, alive_ms=1, record_text="{}", signature="0" * 128,
                 roles=["Router", "ExpertHolder"], http_endpoint=f"http://10.0.{i // 256}.{i % 256}:8000",
                 quic_endpoint=f"10.0.{i // 256}.{i % 256}:4433", quic_cert_sha256=f"{i:064x}",
                 activation_codecs=["f32"], price_per_input_token="0")
        for i in range(n_providers)], batch_size=500)
    pks = list(Provider.objects.order_by("pk").values_list("pk", flat=True))
    rows = []
    for layer in range(n_layers):
        for expert in range(n_experts):
            copies = int(rng.integers(2, 5))
            for p in rng.choice(n_providers, size=copies, replace=False).tolist():
                rows.append(Holding(provider_id=pks[p], model_id=MODEL, layer=layer, expert=expert,
                                    residency="Warm" if rng.random() < 0.7 else "Cold",
                                    committed_tps=int(rng.integers(0, 600)),
                                    blob_uri=f"tenzro://blob/{layer * n_experts + expert:064x}"))
    Holding.objects.bulk_create(rows, batch_size=2000)
    return len(rows)


def _timed_ms(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """(median, min) of `repeat` calls in ms; the min is the figure least disturbed by other load."""
    fn()  # warm: templates compiled, node identity read, connections open
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000.0)
    return statistics.median(times), min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--providers", type=int, default=1000)
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    _setup_django()

    from django.conf import settings
    from django.db import connection
    from django.shortcuts import render
    from django.test import Client, RequestFactory

    from apps.dashboard.selectors_shards import shardmap_grid

    settings.TENZRO_DASHBOARD_PUBLIC = True
    settings.ALLOWED_HOSTS = ["*"]
    holdings = _fill(args.providers, args.layers, args.experts)
    client = Client()
    url = f"/shardmap/?model={MODEL}"
    response = client.get(url)
    assert response.status_code == 200, response.status_code
    queries: list[str] = []

    def count(execute, sql, params, many, context):  # every statement on any connection wrapper's cursor
        queries.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        client.get(url)
    page_bytes = len(response.content)

    request = RequestFactory().get("/")
    from django.contrib.auth.models import AnonymousUser

    request.user = AnonymousUser()
    timings = {
        "page": _timed_ms(lambda: client.get(url), args.repeat),
        "data.json": _timed_ms(lambda: client.get(f"/shardmap/data.json?model={MODEL}"), args.repeat),
        "selectors": _timed_ms(lambda: shardmap_grid(model_id=MODEL), args.repeat),
        "empty page": _timed_ms(lambda: render(request, "dashboard/base.html"), args.repeat),
    }
    empty = timings["empty page"][0]
    rows = [[name, med, low, med / empty] for name, (med, low) in timings.items()]
    print_table(f"Shard map page: {args.providers} providers, {args.layers} x {args.experts} map, {holdings} holdings "
                f"(median of {args.repeat})", ["what", "median ms", "min ms", "median / empty page"], rows)
    print(f"\npage: {len(queries)} queries, {page_bytes / 1024:.0f} KiB; target < {TARGET_MS:.0f} ms: "
          f"{'met' if timings['page'][0] < TARGET_MS else 'MISSED'} (median)")
    write_results("dashboard", {
        "providers": args.providers, "layers": args.layers, "experts": args.experts, "holdings": holdings,
        "repeat": args.repeat, "median_ms": {k: v[0] for k, v in timings.items()},
        "min_ms": {k: v[1] for k, v in timings.items()}, "page_queries": len(queries), "page_bytes": page_bytes,
        "target_ms": TARGET_MS, "target_met": timings["page"][0] < TARGET_MS,
        "reference": "empty page: dashboard/base.html rendered with nothing in it, same process",
    }, [headline("shard map page render (median)", timings["page"][0], "ms", reference="empty page render",
                 reference_value=timings["empty page"][0], target=f"< {TARGET_MS:.0f} ms")])


if __name__ == "__main__":
    main()
