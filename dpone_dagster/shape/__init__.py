"""Rules that turn a batch's decoded rows into the sink's messages, as pure functions over Arrow
arrays (no Spark, no broker): keys, the dpone envelope, headers."""
