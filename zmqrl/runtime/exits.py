"""Exit codes of a role process: what its end tells whoever started it.

Written by the role (its main, its watchdog) and read by the supervisor's restart policy
(zmqrl/supervisor/restarts.py), docker compose's ``restart: on-failure`` and Kubernetes alike, so
they live below both (docs/fault-tolerance.md, "Exit codes").
"""

from __future__ import annotations

EXIT_OK = 0  # finished, or stopped because the supervisor or the learner asked
EXIT_FAILED = 1  # an unexpected exception, a dead thread: restarted
EXIT_OPERATOR = 2  # a setting that cannot work, a refused resume, a full disk: never restarted
EXIT_HUNG = 3  # its own watchdog ended it (no main-loop progress): restarted
# Its supervisor fell silent and did not come back within the rejoin grace (zmqrl/runtime/link.py,
# REJOIN_GRACE_SECONDS): the role stopped cleanly, and exits non-zero so that a restart policy
# (compose's on-failure, Kubernetes) starts it again, to wait for a supervisor anew.
EXIT_LOST_SUPERVISOR = 4
# A shell reports a process ended by signal N as 128 + N (a role that handles SIGTERM and SIGINT
# itself exits so too); Popen reports -N.
SIGNAL_EXIT_BASE = 128
