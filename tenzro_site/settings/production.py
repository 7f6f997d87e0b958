"""Production overrides: everything still comes from the environment."""

from tenzro_site.settings.base import *  # noqa: F403
from tenzro_site.settings.env import env_bool

SESSION_COOKIE_SECURE = env_bool("DJANGO_SECURE_COOKIES", True)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
