"""The step-side API: what a step's own code calls to talk to its node's agent.

`io_wait()` marks an I/O phase (a guest may use the GPU meanwhile); `gate()` is where a
guest waits for its turn. Both speak over a small shared-memory `Channel` that the agent
creates per step, so a call costs microseconds and needs no agent round trip.
"""

from m27.step._channel import Channel
from m27.step._process import gate, io_wait

__all__ = ["Channel", "gate", "io_wait"]
