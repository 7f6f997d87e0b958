"""What every CLI command shares: the node to talk to and how to print."""

from __future__ import annotations

import json
import sys
from typing import Any

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
            click.echo(f"tenzro: {exc}", err=True)
            sys.exit(1)
