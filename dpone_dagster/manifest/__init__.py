"""dpone manifest models, loading and validation."""

from dpone_dagster.manifest.loader import (
    ManifestError,
    discover_manifests,
    load_manifest,
    manifest_from_dict,
    parse_manifest,
)
from dpone_dagster.manifest.models import KafkaSink, KafkaSource, Manifest, SqlSource

__all__ = [
    "KafkaSink",
    "KafkaSource",
    "Manifest",
    "ManifestError",
    "SqlSource",
    "discover_manifests",
    "load_manifest",
    "manifest_from_dict",
    "parse_manifest",
]
