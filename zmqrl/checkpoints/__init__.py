"""Checkpoints: the file format, replay snapshots, which one to deploy, and ``load_policy``."""
