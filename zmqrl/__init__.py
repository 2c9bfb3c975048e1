"""zmqrl: asynchronous reinforcement learning over ZeroMQ."""

__version__ = "0.1.0"
