"""Logs of every process: secrets redacted, text or JSON lines (core/logs.py).

In-process: the filter and formatter on a real logging handler writing to a buffer.
"""

import base64
import io
import json
import logging
import logging.config

import pytest

from apps.node.supervisor import NodeOptions, Supervisor
from core.logs import JsonFormatter, QuietNormalCloses, RedactSecrets, Secrets, logging_config, redact
from testkit.secrets import assert_no_secrets

TOKEN = "op-token-0123456789abcdef"
SEED = bytes(range(32))


@pytest.fixture
def node_dir(tmp_path, monkeypatch):
    """A data dir with a node key and an operator token file, as the supervisor leaves it."""
    (tmp_path / "node.key").write_bytes(SEED)
    (tmp_path / "operator.token").write_text(TOKEN + "\n")
    monkeypatch.setenv("TENZRO_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("TENZRO_OPERATOR_TOKEN", raising=False)
    monkeypatch.setenv("DJANGO_SECRET_KEY", "django-secret-key-for-this-test-only-0123456789")
    return tmp_path


def _logger(fmt: str) -> tuple[logging.Logger, io.StringIO]:
    """A logger with the node's handler setup (the redacting filter, the chosen formatter)."""
    config = logging_config(level="DEBUG", fmt=fmt)
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.addFilter(RedactSecrets(secrets=Secrets()))
    text_format = config["formatters"]["node"].get("format")
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(text_format))
    logger = logging.getLogger(f"tenzro.test.{fmt}")
    logger.handlers, logger.propagate, logger.level = [handler], False, logging.DEBUG
    return logger, buffer


def test_every_secret_is_redacted_from_messages_args_exceptions_and_extras(node_dir) -> None:
    logger, buffer = _logger("text")
    logger.info("token %s and key %s / %s", TOKEN, SEED.hex(), base64.b64encode(SEED).decode())
    logger.warning("headers {'Authorization': 'Bearer %s', 'Host': 'x'}", "abcdefgh12345678")
    logger.warning("Authorization: Basic dXNlcjpwYXNzd29yZA==")
    logger.error("db postgres://tenzro:hunter2-secret@db.internal:5432/tenzro and redis://:s3cret-pw@r:6379/0")
    logger.info("django key django-secret-key-for-this-test-only-0123456789", extra={"detail": f"x {TOKEN} y"})
    try:
        raise ValueError(f"bad token {TOKEN}")
    except ValueError:
        logger.exception("failed with postgres://u:pw-in-traceback@h/db")
    text = buffer.getvalue()
    for secret in (TOKEN, SEED.hex(), base64.b64encode(SEED).decode(), "abcdefgh12345678", "dXNlcjpwYXNzd29yZA==",
                   "hunter2-secret", "s3cret-pw", "pw-in-traceback", "django-secret-key-for-this-test-only"):
        assert secret not in text, secret
    assert "postgres://tenzro:[redacted]@db.internal:5432/tenzro" in text  # user and host still say where
    assert "ValueError: bad token [redacted]" in text  # the traceback is kept, redacted
    assert text.count("[redacted]") >= 10
    assert_no_secrets(text, token=TOKEN, key_hex=SEED.hex(), data_dir=node_dir)


def test_assert_no_secrets_names_what_leaked_without_printing_it(node_dir) -> None:
    with pytest.raises(AssertionError) as caught:
        assert_no_secrets(f"line one\nkey {SEED.hex()}\n", data_dir=node_dir)
    assert "the node key (hex) on line(s) [2]" in str(caught.value) and SEED.hex() not in str(caught.value)
    for leak in (f"Authorization: Bearer {TOKEN}x", "postgres://u:plain@h/db", "authorization=abcdefghijk"):
        with pytest.raises(AssertionError):
            assert_no_secrets(leak)
    assert_no_secrets("Authorization: [redacted] postgres://u:[redacted]@h/db Bearer [redacted]")


def test_json_lines_carry_role_node_level_logger_exception_and_extras(node_dir, monkeypatch) -> None:
    monkeypatch.setenv("TENZRO_PROCESS_ROLE", "expert-worker")
    logger, buffer = _logger("json")
    logger.info("served %d batches", 3, extra={"holder": "ab" * 32, "rows": 7})
    try:
        raise ZeroDivisionError("division by zero")
    except ZeroDivisionError:
        logger.exception("token %s broke", TOKEN)
    first, second = (json.loads(line) for line in buffer.getvalue().splitlines())
    assert first["message"] == "served 3 batches" and first["level"] == "INFO"
    assert first["logger"] == "tenzro.test.json" and first["role"] == "expert-worker"
    assert first["extra"] == {"holder": "ab" * 32, "rows": 7}
    assert len(first["node"]) == 64 and first["ts"].endswith("+00:00") and first["pid"] > 0
    assert second["level"] == "ERROR" and second["message"] == "token [redacted] broke"
    assert "ZeroDivisionError" in second["exception"] and TOKEN not in buffer.getvalue()


def test_the_settings_route_every_logger_through_the_redacting_handler() -> None:
    config = logging_config(level="INFO", fmt="json")
    assert config["handlers"]["console"]["filters"] == ["redact"]
    for name in ("uvicorn", "uvicorn.error", "celery"):
        assert config["loggers"][name]["handlers"] == ["console"]
    with pytest.raises(ValueError, match="TENZRO_LOG_FORMAT"):
        logging_config(level="INFO", fmt="xml")
    # the running (test) settings did install it
    handlers = [h for h in logging.getLogger().handlers if any(isinstance(f, RedactSecrets) for f in h.filters)]
    assert handlers


def test_normal_quic_closes_are_debug_and_closes_with_an_error_stay_warnings(caplog) -> None:
    """qh3 logs every peer close at WARNING; the settings' filter keeps only the ones with an error code."""
    assert logging_config(level="INFO", fmt="text")["loggers"]["quic"]["filters"] == ["normal_closes"]
    quic = logging.getLogger("quic")
    assert any(isinstance(f, QuietNormalCloses) for f in quic.filters)  # installed by the test settings too
    with caplog.at_level(logging.INFO):
        quic.warning("Native peer close: %r", ("peer_closed", True, 0, None, b""))
        quic.warning("Native peer close: %r", ("peer_closed", False, 0x0A, 8, b"protocol violation"))
        quic.warning("something else entirely")
    assert [(r.levelname, r.getMessage()[:24]) for r in caplog.records if r.name == "quic"] == [
        ("WARNING", "Native peer close: ('pee"), ("WARNING", "something else entirely")]
    assert "protocol violation" in caplog.records[-2].getMessage()
    record = logging.LogRecord("quic", logging.WARNING, "x", 1, "Native peer close: %r",
                               (("peer_closed", True, 0, None, b""),), None)
    with caplog.at_level(logging.DEBUG):
        assert QuietNormalCloses().filter(record) and record.levelname == "DEBUG"


def test_aioquic_connection_chatter_is_debug_unless_the_node_logs_at_debug() -> None:
    """aioquic says every handshake, ALPN and close on the "quic" logger at INFO: a node's normal traffic."""
    assert logging_config(level="INFO", fmt="text")["loggers"]["quic"]["level"] == "WARNING"
    assert logging_config(level="debug", fmt="text")["loggers"]["quic"]["level"] == "DEBUG"
    assert not logging.getLogger("quic").isEnabledFor(logging.INFO)  # the running (test) settings


def test_redact_leaves_ordinary_text_alone() -> None:
    text = "forward of 12 tokens over quic://127.0.0.1:4433 took 3.2 ms (http://node:8000/rpc)"
    assert redact(text, ["unrelated-secret-value"]) == text


def test_the_supervisor_redacts_what_children_print_outside_logging(node_dir) -> None:
    """A child's raw stdout (a library's print, Celery's banner) passes the supervisor's own redaction."""
    out = io.StringIO()
    options = NodeOptions(http="127.0.0.1:1", quic="127.0.0.1:2", data_dir=node_dir, peers=[],
                          redis_url="redis://:pw-of-redis@127.0.0.1:1/0", roles=["Router"])
    supervisor = Supervisor(options, out=out)
    supervisor.log("celery-worker", f"print({TOKEN!r}) and {SEED.hex()} via redis://:pw-of-redis@127.0.0.1:1/0\n")
    assert out.getvalue() == ("celery-worker| print('[redacted]') and [redacted] via "
                              "redis://:[redacted]@127.0.0.1:1/0\n")


def test_with_json_logs_the_supervisor_passes_json_through_and_wraps_everything_else(node_dir, monkeypatch) -> None:
    monkeypatch.setenv("TENZRO_LOG_FORMAT", "json")
    out = io.StringIO()
    options = NodeOptions(http="127.0.0.1:1", quic="127.0.0.1:2", data_dir=node_dir, peers=[],
                          redis_url="redis://127.0.0.1:1/0", roles=["Router"])
    supervisor = Supervisor(options, out=out)
    child = json.dumps({"ts": "t", "level": "INFO", "logger": "x", "role": "web", "message": "up"})
    supervisor.log("web", child + "\n")
    supervisor.log("celery-worker", f" -------------- celery@host v5 token {TOKEN}\n")
    supervisor.log("node", "started web (pid 1)")
    passed, banner, own = (json.loads(line) for line in out.getvalue().splitlines())
    assert passed == json.loads(child)
    assert banner["role"] == "celery-worker" and banner["logger"] == "stdout" and "[redacted]" in banner["message"]
    assert own["role"] == "supervisor" and own["message"] == "started web (pid 1)" and own["level"] == "INFO"
