"""Executors: how a step's process runs (local, container, Slurm)."""
