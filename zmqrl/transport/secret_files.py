"""Whether a secret file is open to more than the process that reads it: one rule for the CurveZMQ
secret keys (zmqrl/transport/keys.py) and the control plane's token and role keys
(zmqrl/transport/control_keys.py). It warns, never refuses: the file is the operator's to place.

The rule, and why:

- Any permission for others (``mode & 0o007``) warns: every user of the host, every process of a
  pod whatever its uid, can read the secret (or replace it).
- Group permissions warn, except *read* for a group on a file that **root owns** and whose group
  is **one of this process's groups** (its own or a supplementary one): 0440 or 0640 as
  ``root:<our group>``. That is the shape an orchestrator gives a secret it mounts for a process
  running as another user: Kubernetes writes a Secret volume's files as root, with the pod's
  ``fsGroup`` as their group (every container process gets it as a supplementary group) and the
  mode asked for (``defaultMode: 0440``); Docker's secrets with ``gid`` and ``mode: 0440`` too.
  Warning there made every role of such a pod warn about the one setup it cannot improve on.
  Root ownership is what tells that apart: only an administrator, or an orchestrator acting as
  one, can have put the file there and chosen its group.
- Group permissions on a file this process's user owns still warn, whatever the group: on a
  shared cluster host that group is often one every user is in (``users``), which is exactly the
  exposure worth a warning, and ``chmod 600`` costs nothing there.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Collection
from pathlib import Path

# Permission bits for users other than the owner and the file's group.
OTHERS_BITS = 0o007
# Permission bits for the file's group, and the one of them a mounted secret may have.
GROUP_BITS, GROUP_READ = 0o070, 0o040
# The owner of a file only an administrator or an orchestrator can have placed.
ROOT_UID = 0


def process_groups() -> set[int]:
    """This process's group ids: its effective group and its supplementary ones (an fsGroup)."""
    return {os.getegid(), *os.getgroups()}


def exposure(st: os.stat_result, groups: Collection[int] | None = None) -> str | None:
    """Who besides its owner may use the file ``st`` describes, in words ("other users", "its
    group 100"), or None when nobody may, or only as the rule above allows. ``groups``: the
    process's group ids (default: :func:`process_groups`)."""
    mode = stat.S_IMODE(st.st_mode)
    if mode & OTHERS_BITS:
        return "other users"
    if not mode & GROUP_BITS:
        return None
    ours = process_groups() if groups is None else set(groups)
    mounted = mode & GROUP_BITS == GROUP_READ and st.st_uid == ROOT_UID and st.st_gid in ours
    return None if mounted else f"its group {st.st_gid}"


def exposure_warning(path: Path, what: str, groups: Collection[int] | None = None) -> str | None:
    """The warning to log for ``what`` (e.g. "secret key") at ``path``, or None (also when the file
    cannot be stat'ed: reading it reports that)."""
    try:
        st = path.stat()
    except OSError:
        return None
    who = exposure(st, groups)
    if who is None:
        return None
    return (
        f"{what} {path} is readable by {who} (mode {stat.S_IMODE(st.st_mode):o}): chmod 600 it (a secret "
        "an orchestrator mounts for another user: mode 0440, owned by root, group one of the process's, "
        "e.g. Kubernetes' fsGroup)"
    )
