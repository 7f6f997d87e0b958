"""Celery tasks of the providers app (adapters over rounds.py and services.py)."""

import logging

from celery import shared_task

from apps.providers.rounds import gossip_round

logger = logging.getLogger(__name__)


@shared_task(name="tenzro.providers.gossip_round", ignore_result=True, expires=30)
def gossip_round_task() -> None:
    """One gossip round: re-sign if needed, expire, push rumors, sync with one peer."""
    summary = gossip_round()
    logger.debug("gossip round: %s", summary)
