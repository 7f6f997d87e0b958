"""`manage.py check --deploy` is clean under tenzro_site.settings.production with the documented
production environment (docs/operations.md, "Production settings"), and says what is missing
without it. A subprocess: the settings module is chosen at process start."""

import os
import subprocess
import sys

from core.env import BASE_DIR

PRODUCTION_ENV = {
    "DJANGO_SECRET_KEY": "k" * 10 + "0123456789abcdefghijklmnopqrstuvwxyz-_ABCDEFGHIJ",
    "DJANGO_ALLOWED_HOSTS": "node.example.org",
    "DJANGO_BEHIND_TLS_PROXY": "1",
    "DJANGO_CSRF_TRUSTED_ORIGINS": "https://node.example.org",
}


def check_deploy(tmp_path, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "TENZRO_DATA_DIR"))}
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=BASE_DIR, capture_output=True, text=True, timeout=120,
        env={**clean, "DJANGO_SETTINGS_MODULE": "tenzro_site.settings.production",
             "TENZRO_DATA_DIR": str(tmp_path / "data"), **env})


def test_check_deploy_is_clean_with_the_documented_production_env(tmp_path) -> None:
    done = check_deploy(tmp_path, **PRODUCTION_ENV)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout


def test_check_deploy_names_what_an_unsafe_env_gets_wrong(tmp_path) -> None:
    done = check_deploy(tmp_path, **{**PRODUCTION_ENV, "DJANGO_SECRET_KEY": "short", "DJANGO_DEBUG": "1",
                                     "DJANGO_SECURE_SSL_REDIRECT": "0", "DJANGO_HSTS_SECONDS": "0"})
    assert done.returncode != 0
    for warning in ("security.W009", "security.W018", "security.W008", "security.W004"):
        assert warning in done.stderr + done.stdout, warning
