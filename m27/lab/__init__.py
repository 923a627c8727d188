"""Lab scale: the Prefect worker type `m27`, deployments and pool capacity."""
