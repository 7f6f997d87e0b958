"""Who may see a dashboard page: anyone when TENZRO_DASHBOARD_PUBLIC is true, else a logged-in user.

The setting is read on every request (not at import), so a test or an operator's override applies
without reloading the URLconf. Mutations never rely on this: they check `operator_required`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse

View = Callable[..., HttpResponse]


def dashboard_page(view: View) -> View:
    """A read-only page: public per TENZRO_DASHBOARD_PUBLIC, otherwise login required."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not settings.TENZRO_DASHBOARD_PUBLIC and not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        return view(request, *args, **kwargs)

    return wrapped
