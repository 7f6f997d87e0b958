"""Signals of the catalog: the dashboard shows prepare jobs' progress live without the catalog knowing it."""

from django.dispatch import Signal

# Sent after a job's state or progress commits; kwargs: job (prepare_job_to_dict's JSON-ready dict).
# Coalesced by services._push_progress: at most one per TENZRO_PREPARE_PUSH_INTERVAL_S per job while
# it runs, plus every state change, so a 128-expert job does not flood the dashboards.
prepare_progressed = Signal()
