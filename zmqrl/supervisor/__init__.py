"""The supervisor: launch and watch-only supervision, liveness, restarts, dashboard, status."""
