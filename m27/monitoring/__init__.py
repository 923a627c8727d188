"""Monitoring: Prometheus collectors, metric families and per-step energy."""
