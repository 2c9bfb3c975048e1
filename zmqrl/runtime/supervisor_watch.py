"""A supervised role's verdict on its supervisor: joined, silent, back, or lost.

No process of a run may outlive its supervisor for good, whatever killed it: a role that watches
its supervisor (``ZMQRL_SUPERVISED=1``) leaves when it stops hearing the supervisor's heartbeat.
But "the supervisor went silent" is not "the supervisor said stop". A supervisor that an
orchestrator restarts (compose's ``restart: on-failure``, a Kubernetes Deployment) is back within
seconds and takes the running roles back; roles that had left at its first silence would be gone,
and with exit 0 no restart policy would bring them back. So on silence a role keeps running and
beating for :data:`REJOIN_GRACE_SECONDS`, and only past it stops, with the verdict "lost"
(its process then exits ``EXIT_LOST_SUPERVISOR``, non-zero, so its orchestrator restarts it to wait
for a supervisor anew). A stop the supervisor broadcasts ends a role at once, as before.

Roles that ``zmqrl launch`` started get no grace: the kernel ends them when the launch dies
(parent-death signal), and no other launch would take them back; one that hangs is left after
``heartbeat_timeout``, as ever.
"""

from __future__ import annotations

import logging

# How long a role whose supervisor fell silent keeps running (and beating) for it to come back,
# counted from the end of supervisor.heartbeat_timeout. Long enough for an orchestrator to restart
# a supervisor that died: the container's restart, Python's start, and a tracker slow to answer
# (the supervisor's heartbeat starts before it opens one).
REJOIN_GRACE_SECONDS = 60.0

log = logging.getLogger("zmqrl.link")


class SupervisorWatch:
    """Judges, from when the supervisor was last heard (``seen``, clock seconds, None: not yet),
    whether the role must leave. ``join_timeout``: how long to wait for a first heartbeat;
    ``heartbeat_timeout``: silence this long is noticed; ``rejoin_grace``: then tolerated this much
    longer. Logs each change (joined, silent, heard again) once."""

    def __init__(
        self,
        endpoint: str,
        created: float,
        *,
        join_timeout: float,
        heartbeat_timeout: float,
        rejoin_grace: float,
    ) -> None:
        self._endpoint = endpoint
        self._created = created
        self._join_timeout = join_timeout
        self._heartbeat_timeout = heartbeat_timeout
        self.rejoin_grace = rejoin_grace
        self._joined_said = False
        self._silence_said = False
        self._left = False
        self.lost = False  # left because the supervisor stayed silent past the grace

    def judge(self, now: float, seen: float | None) -> str | None:
        """The reason to leave, once (None before, and after it was given)."""
        if self._left:
            return None
        if seen is None:
            waited = now - self._created
            if waited <= self._join_timeout:
                return None
            self._left = True
            reason = f"no supervisor at {self._endpoint} within {self._join_timeout:.0f} s"
            log.error("%s: shutting down (supervisor.join_timeout)", reason)
            return reason
        if not self._joined_said:
            self._joined_said = True
            log.info("supervisor heard from after %.1f s", now - self._created)
        silent = now - seen
        if silent <= self._heartbeat_timeout:
            if self._silence_said:
                self._silence_said = False
                log.info("supervisor heard again: carrying on under it")
            return None
        if silent <= self._heartbeat_timeout + self.rejoin_grace:
            if not self._silence_said:
                self._silence_said = True
                log.warning(
                    "supervisor silent for %.0f s: carrying on, and beating, for up to %.0f s more for "
                    "it to come back (a restarted supervisor takes this process back)",
                    silent,
                    self._heartbeat_timeout + self.rejoin_grace - silent,
                )
            return None
        self._left = self.lost = True
        reason = f"supervisor silent for {silent:.0f} s"
        grace = f", past the rejoin grace of {self.rejoin_grace:.0f} s" if self.rejoin_grace else ""
        log.error("%s%s: shutting down (the run has lost its supervisor)", reason, grace)
        return reason
