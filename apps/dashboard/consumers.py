"""Websocket of the dashboard: joins the dashboard group and forwards its events."""

from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from apps.dashboard.services import DASHBOARD_GROUP


class DashboardConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        await self.channel_layer.group_add(DASHBOARD_GROUP, self.channel_name)
        await self.accept()
        await self.send_json({"event": "hello", "payload": {}})

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(DASHBOARD_GROUP, self.channel_name)

    async def dashboard_event(self, message: dict[str, Any]) -> None:
        await self.send_json({"event": message["event"], "payload": message["payload"]})
