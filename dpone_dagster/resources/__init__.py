"""resources."""
