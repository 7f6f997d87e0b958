"""What every CLI command shares: the node to talk to and how to print."""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

import click

from cli.client import NodeClient, NodeError, operator_token


def print_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=False))


class CliContext:
    def __init__(self, node: str, token: str | None) -> None:
        self.node = node
        self.token = token

    def client(self) -> NodeClient:
        return NodeClient(self.node, token=operator_token(self.token))

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        try:
            return self.client().call(method, params)
        except NodeError as exc:
            fail(str(exc))


def fail(message: str) -> NoReturn:
    """One line on stderr, exit status 1: how every command reports what went wrong."""
    click.echo(f"tenzro: {message}", err=True)
    sys.exit(1)
