"""Supervision: a role's link to its supervisor, liveness verdicts, what both supervisors share, what
the operator sees while a run goes (``monitor``) and the reports at its end.

The process mains in zmqrl/roles/ are written against these: each role holds a ``SupervisorLink``;
``launch`` (roles/supervisor.py) and ``supervise`` (roles/watcher.py) build on ``Oversight``.
"""
