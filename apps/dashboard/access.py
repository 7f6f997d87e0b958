"""Who may see a dashboard page: everyone when TENZRO_DASHBOARD_PUBLIC is true, else a logged-in user.

Read at request time, not import time, so a test (or an operator flipping the setting) needs no
re-import. Mutating views must not use this: they always need `login_required` (and CSRF).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse

View = Callable[..., HttpResponse]


def dashboard_page(view: View) -> View:
    """Decorate a read-only dashboard view: public per TENZRO_DASHBOARD_PUBLIC, else login required."""
    guarded = login_required(view)

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if settings.TENZRO_DASHBOARD_PUBLIC:
            return view(request, *args, **kwargs)
        return guarded(request, *args, **kwargs)

    return wrapper
