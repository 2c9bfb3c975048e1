"""`zmqrl bench`: what zmqrl's processes and sockets cost over the bare computation, as ratios
measured side by side in one run (see docs/performance.md)."""
