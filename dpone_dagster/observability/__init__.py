"""Run artifacts and metrics files written under observability.artifacts.path."""
