"""Dagster run retries for manifest assets, decided per failure.

The daemon retries a failed run when `run_retries` is enabled in dagster.yaml and the run's
`dagster/max_retries` tag allows another attempt, unless the run carries
`dagster/retry_on_asset_or_op_failure: false`. Both tags are read when the failure is recorded,
so the asset sets them while it runs: the manifest's attempt budget at the start (whatever
launched the run: UI, CLI, sensor, schedule, backfill), and the refusal when the failure is one a
retry cannot fix (errors.is_retryable).
"""

from __future__ import annotations

from dagster import AssetExecutionContext

from dpone_dagster.manifest.models import Manifest

MAX_RETRIES_TAG = "dagster/max_retries"
RETRY_ON_FAILURE_TAG = "dagster/retry_on_asset_or_op_failure"
# Set by Dagster when it records a failed run: whether the daemon will retry it.
WILL_RETRY_TAG = "dagster/will_retry"


def tag_retry_budget(context: AssetExecutionContext, manifest: Manifest) -> None:
    """The manifest's retries on this run, unless whoever launched it set their own."""
    if MAX_RETRIES_TAG not in context.run.tags:
        retries = manifest.dagster.retries.max_attempts - 1
        context.instance.add_run_tags(context.run_id, {MAX_RETRIES_TAG: str(retries)})


def refuse_retry(context: AssetExecutionContext) -> None:
    """This run failed on its data: the daemon must not run it again."""
    context.instance.add_run_tags(context.run_id, {RETRY_ON_FAILURE_TAG: "false"})
