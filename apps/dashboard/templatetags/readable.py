"""Filters for what people read on the dashboard.

`{{ provider_id|provider:provider_names }}`: a provider, its name (from its signed record) with the
first hex digits of its id, the whole id on hover and for copying (static/dashboard/live.js
providerLabel() renders the same in the page's scripts). `{{ moment|when }}`: a time, relative."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django import template
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from apps.providers.records import is_provider_id

register = template.Library()


@register.filter
def provider(provider_id: str, names: Any = None) -> SafeString:
    if not is_provider_id(provider_id or ""):  # a ledger's own accounts ("burn", …) are not providers
        return format_html("<span>{}</span>", provider_id or "–")
    name = names.get(provider_id) if names is not None else None
    if name and name.endswith(provider_id[:6]):  # the default name already ends with the id's digits
        return format_html('<span class="provider" title="{}" data-provider-id="{}">{}</span>', provider_id,
                           provider_id, name)
    if name:
        return format_html('<span class="provider" title="{}" data-provider-id="{}">{} <code class="pid">{}</code>'
                           "</span>", provider_id, provider_id, name, provider_id[:6])
    return format_html('<span class="provider" title="{}" data-provider-id="{}"><code>{}…</code></span>',
                       provider_id, provider_id, (provider_id or "")[:12])


@register.filter
def when(moment: dt.datetime | str | None) -> SafeString:
    """A time as people read it on a page: how long ago (or "in …") at render, the exact UTC time on
    hover and in the `datetime` attribute, never an ISO string with microseconds. `moment`: a datetime
    or its ISO text (what the records' dicts carry)."""
    if isinstance(moment, str):
        try:
            moment = dt.datetime.fromisoformat(moment)
        except ValueError:
            return format_html("{}", moment)
    if moment is None:
        return format_html("–")
    seconds = (timezone.now() - moment).total_seconds()
    span = abs(seconds)
    amount = (f"{span:.0f} s" if span < 90 else f"{span / 60:.0f} min" if span < 5400
              else f"{span / 3600:.1f} h" if span < 172800 else f"{span / 86400:.0f} d")
    text = f"{amount} ago" if seconds >= 0 else f"in {amount}"
    return format_html('<time datetime="{}" title="{}">{}</time>', moment.isoformat(),
                       moment.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"), text)


@register.filter
def duration(seconds: float | None) -> str:
    """115 -> "1 min 55 s", 7260 -> "2 h 1 min" (static/dashboard/util.js duration() is the same)."""
    if seconds is None:
        return "–"
    return _duration(float(seconds))


def _duration(seconds: float) -> str:
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


@register.filter
def quant(value: Any) -> str:
    """A prepare job's quantization: a preset's name, or each projection's type ("f32" for none)."""
    if isinstance(value, dict):
        return ", ".join(f"{name}: {kind or 'f32'}" for name, kind in value.items())
    return str(value or "f32")
