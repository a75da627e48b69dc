"""Declarative automation on a manifest asset (`dagster.automation`), evaluated by the daemon's
automation sensor: `on_cron` materializes the asset once per cron tick unless a run of it is in
progress. A failed run is not re-requested before the next tick (run retries still apply)."""

from __future__ import annotations

from dagster import AutomationCondition

from dpone_dagster.manifest.models import Manifest


def automation_condition(manifest: Manifest) -> AutomationCondition | None:
    options = manifest.dagster.automation
    if options is None:
        return None
    return (
        AutomationCondition.cron_tick_passed(options.on_cron, options.timezone).since_last_handled()
        & ~AutomationCondition.in_progress()
    ).with_label(f"on_cron({options.on_cron}, {options.timezone})")
