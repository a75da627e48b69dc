"""dpone_dagster: bounded batch Kafka ETL on Spark as a Dagster code location."""
