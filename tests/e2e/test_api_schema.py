"""schemathesis against a live node: every operation of /api/openapi.json, `--checks all`.

Twice: as an outsider (no token: operator methods must answer 401 and nothing else), then as
the operator (every method exercised). Its stateful phase follows the schema's OpenAPI links
(prepare → status, proposal → approve/reject, load → unload, generate → generation, receipts →
dispute, and those schemathesis infers). tests/e2e/schemathesis.toml and schemathesis_hooks.py
say which refusals of schema-valid data are allowed, and why.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.nodes import TOKEN

pytestmark = pytest.mark.e2e
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ST = Path(sys.executable).with_name("st")


@pytest.mark.parametrize("as_operator", [False, True], ids=["outsider", "operator"])
def test_schemathesis_finds_no_failure(start_module_node, as_operator: bool) -> None:
    node = start_module_node()
    # the outsider's answers do not depend on the data (the door refuses before a body is read): fewer
    # examples per operation still reach every operation and every link
    examples = "25" if as_operator else "8"
    argv = [str(ST), "--config-file", str(HERE / "schemathesis.toml"), "run", f"{node.url}/api/openapi.json",
            "--checks", "all", "--max-examples", examples, "--seed", "20261130", "--request-timeout", "30"]
    if as_operator:
        argv += ["-H", f"Authorization: Bearer {TOKEN}"]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.e2e.schemathesis_hooks", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-12000:] + done.stderr[-4000:]
    summary = next(line for line in done.stdout.splitlines() if " generated, " in line)
    assert "passed" in summary and "found" not in summary, done.stdout[-3000:]
    # The stateful phase ran: the OpenAPI links (apps' `links=`) chain operations into scenarios.
    assert "✅  Stateful" in done.stdout and "Scenarios:" in done.stdout, done.stdout[-3000:]


def test_schemathesis_finds_no_failure_in_the_openai_api(start_module_node) -> None:
    """/v1 (docs/openai.md) with a client key: every refusal is OpenAI-shaped 4xx, never a server error.
    No model is loaded, so schema-valid generations answer 404 model_not_found after the key and the
    body were checked; a schema-invalid one answers 400."""
    node = start_module_node()
    key = node.result("tenzro_keysCreate", {"name": "schemathesis", "requests_per_minute": 1_000_000},
                      token=TOKEN)["key"]
    argv = [str(ST), "run", f"{node.url}/v1/openapi.json", "--checks", "all", "--max-examples", "40",
            "--seed", "20261201", "--request-timeout", "30", "-H", f"Authorization: Bearer {key}"]
    done = subprocess.run(argv, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-12000:] + done.stderr[-4000:]
    summary = next(line for line in done.stdout.splitlines() if " generated, " in line)
    assert "passed" in summary and "found" not in summary, done.stdout[-3000:]
