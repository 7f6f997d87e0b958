"""Production overrides: everything still comes from the environment (docs/operations.md,
"Production settings"). `manage.py check --deploy` is clean with these defaults once
DJANGO_SECRET_KEY (50+ characters) and DJANGO_ALLOWED_HOSTS are set
(tests/node/test_production_settings.py).

The web door is meant to sit behind a TLS proxy (nginx, Caddy, a load balancer) that terminates
HTTPS and forwards plain HTTP on loopback: with DJANGO_BEHIND_TLS_PROXY=1 Django trusts the
proxy's X-Forwarded-Proto to know a request came over HTTPS (so it neither redirects it nor
refuses its secure cookies). Only set it when the web port is reachable from the proxy alone:
any client that reaches it directly could claim HTTPS.
"""

from core.env import env_bool, env_int, env_list
from tenzro_site.settings.base import *  # noqa: F403

SESSION_COOKIE_SECURE = env_bool("DJANGO_SECURE_COOKIES", True)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SESSION_COOKIE_HTTPONLY = True
# Plain-HTTP requests are redirected to HTTPS; paths matching these regexes (no leading slash,
# e.g. "^metrics$" for a scraper on a private network) are exempt.
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", True)
SECURE_REDIRECT_EXEMPT = env_list("DJANGO_SECURE_REDIRECT_EXEMPT", "")
if env_bool("DJANGO_BEHIND_TLS_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# HSTS: browsers that saw the node over HTTPS never try plain HTTP again for this long.
SECURE_HSTS_SECONDS = env_int("DJANGO_HSTS_SECONDS", 31_536_000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = env_bool("DJANGO_HSTS_PRELOAD", True)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# The HTTPS origins the dashboard's forms are posted from through the proxy (https://node.example.org).
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", "")
