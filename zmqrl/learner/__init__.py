"""The learner process and everything it runs: ingest, training, checkpointing, reporting."""
