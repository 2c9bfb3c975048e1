"""Transport: the wire format (pure) and the ZeroMQ sockets and channels that carry it."""
