"""The node service: the agent loop, its lease book, the lease client, crash truth and
process supervision."""
