"""The operator's view of a run: a snapshot built from the supervisor's slots (``snapshot``) and
its rendering on a terminal (``render``). Pure code: no threads, sockets or processes here."""

from zmqrl.monitoring.render import plain_line, render_dashboard, sparkline
from zmqrl.monitoring.snapshot import ProcessRow, RunSnapshot, SnapshotBuilder

__all__ = ["ProcessRow", "RunSnapshot", "SnapshotBuilder", "plain_line", "render_dashboard", "sparkline"]
