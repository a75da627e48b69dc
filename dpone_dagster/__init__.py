"""dpone_dagster: bounded batch Kafka ETL on Spark as a Dagster code location."""

import warnings

# confluent-kafka's schema registry client imports authlib's deprecated httpx integration.
warnings.filterwarnings("ignore", message="The httpx module is deprecated")
