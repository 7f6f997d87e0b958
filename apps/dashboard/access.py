"""Who may see a dashboard page: anyone when TENZRO_DASHBOARD_PUBLIC, else a logged-in user."""

from functools import wraps

from django.conf import settings
from django.contrib.auth.decorators import login_required


def dashboard_page(view):
    """Public when TENZRO_DASHBOARD_PUBLIC is true, else login_required; the setting is read per
    request (not at import) so tests and a settings override take effect."""
    guarded = login_required(view)

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        return (view if settings.TENZRO_DASHBOARD_PUBLIC else guarded)(request, *args, **kwargs)

    return wrapper
