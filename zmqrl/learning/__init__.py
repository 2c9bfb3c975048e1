"""The learner's parts, without its sockets or threads: counters, ingest, training, checkpoints, reports.

``Trainer`` (trainer.py) holds them together; the learner process (zmqrl/roles/learner.py) wires
it to sockets, an ingest thread and the supervisor, and serial mode (zmqrl/serial.py) drives the
same object in one thread.
"""
