"""`zmqrl bench`: what zmqrl's processes and sockets cost over the bare computation, as ratios
measured side by side in one run (see docs/performance.md).

Tooling, not the runtime: the package lives in benchmarks/ of the source tree and is installed
beside zmqrl by the same distribution; zmqrl never imports it, except zmqrl/cli/app.py, which
mounts its commands where it is installed. It may import any layer of zmqrl below the command line
(tests/test_architecture.py)."""
