"""What every dashboard page's template needs: the navigation and this node's short id."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from apps.node.selectors import node_identity

# (path, label) of every page, in the navigation's order; a page is added here once it exists.
NAV_PAGES: list[tuple[str, str]] = [("/", "Node"), ("/network/", "Network"), ("/runtime/", "Runtime"),
                                    ("/shardmap/", "Shard map"), ("/dispatch/", "Dispatch"), ("/forwards/", "Forwards"),
                                    ("/generate/", "Generate"), ("/receipts/", "Receipts"), ("/prepare/", "Prepare"),
                                    ("/repair/", "Repair")]


def dashboard(request: HttpRequest) -> dict[str, Any]:
    return {"nav_pages": NAV_PAGES, "node_short": node_identity().provider_id[:12]}
