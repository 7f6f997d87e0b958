"""What every dashboard page's template needs: the navigation and this node's short id."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.utils.functional import cached_property

from apps.node.selectors import node_identity
from apps.providers.selectors import provider_names

# (path, label) of every page, in the navigation's order; a page is added here once it exists.
NAV_PAGES: list[tuple[str, str]] = [("/", "Node"), ("/network/", "Network"), ("/runtime/", "Runtime"),
                                    ("/shardmap/", "Shard map"), ("/dispatch/", "Dispatch"), ("/forwards/", "Forwards"),
                                    ("/generate/", "Generate"), ("/receipts/", "Receipts"), ("/prepare/", "Prepare"),
                                    ("/repair/", "Repair")]


class ProviderNames:
    """Provider id -> name, read on a page's first use (one query), not on pages that show no ids."""

    @cached_property
    def as_dict(self) -> dict[str, str]:
        return provider_names()

    def get(self, provider_id: str, default: str | None = None) -> str | None:
        return self.as_dict.get(provider_id, default)


def dashboard(request: HttpRequest) -> dict[str, Any]:
    return {"nav_pages": NAV_PAGES, "node_short": node_identity().provider_id[:12], "provider_names": ProviderNames()}
