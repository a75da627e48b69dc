"""Stage 7, reconcile: after delivery, the delivery reports and the target topic itself
(source_target_count) must account for what the run meant to produce, or the state stays where
it is and a rerun re-produces the batch."""

from __future__ import annotations

from dpone_dagster.engine.results import RunResult
from dpone_dagster.errors import RunFailed
from dpone_dagster.kafka.delivery import DeliveryStats
from dpone_dagster.manifest.models import Manifest
from dpone_dagster.quality.target import count_records, end_offsets, offset_advance


def reconcile(
    manifest: Manifest,
    stats: DeliveryStats,
    expected: int,
    sink_config: dict,
    before: dict[int, int] | None,
    result: RunResult,
) -> None:
    """Reconciliation after delivery, against what the target topic holds (its end offsets before
    and after producing; with exclusive_target the records in between); in fail mode a mismatch
    stops the state from advancing."""
    from dpone_dagster.quality.gates import failed_gates, run_post_publish

    quality = manifest.quality
    if not any(c.type == "source_target_count" for c in quality.checks):
        # Without a configured tolerance every produced message must be acknowledged.
        if stats.delivered != expected:
            raise RunFailed(
                f"delivery reports account for {stats.delivered} message(s) but {expected} were produced; "
                "no state was advanced"
            )
        return
    topic = manifest.sink.topic
    after = end_offsets(sink_config, topic)
    exclusive = any(c.type == "source_target_count" and c.exclusive_target for c in quality.checks)
    held = count_records(sink_config, topic, before or {}, after) if exclusive else None
    gates = run_post_publish(
        quality.checks,
        quality.mode,
        result.rows_extracted,
        expected,
        stats.delivered,
        offset_advance(before or {}, after),
        held,
    )
    result.gates.extend(g.as_dict() for g in gates)
    blocking = failed_gates(gates)
    if blocking:
        raise RunFailed(
            "reconciliation failed after publishing, state was not advanced (a rerun re-produces the batch): "
            + "; ".join(f"{g.name}: {g.description}" for g in blocking)
        )
