"""Prefect flows of m27 (importable as `flows.pipeline`)."""
