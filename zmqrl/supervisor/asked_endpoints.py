"""The transport endpoints a run asked for, kept beside the ones it was given, so that a resumed run
asks again instead of rebinding a port the OS may have handed to someone else since.

With port 0 (any free port: tests, several runs on one machine) the supervisor learns its own and
the learner's real ports once they are bound, and rewrites ``runs/NAME/config.yaml`` with them: the
actors read that file, and so does a learner it restarts, which must bind again where the actors
connect. ``zmqrl launch --resume runs/NAME`` starts from that file too, minutes or days later,
when the port its first start got may be anyone's ("address already in use"). So the supervisor also
writes ``runs/NAME/endpoints.json``: for each endpoint whose port 0 was resolved, what was asked
and what was bound. A resume puts back what was asked wherever the config still holds what was
bound (an endpoint edited in the file, or given with ``--set``, is left as it is): port 0 stays 0,
a new free port, announced as at the first start. Nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import replace
from pathlib import Path

from zmqrl.config import TransportConfig

# In the run directory, beside config.yaml.
ENDPOINTS_FILE = "endpoints.json"
# The TransportConfig fields that are endpoints a run binds (the learner's two, the supervisor's two).
BOUND_KEYS = ("samples", "weights", "heartbeat", "control")


def record(run_dir: Path, asked: TransportConfig, bound: TransportConfig) -> None:
    """Write what ``asked`` asked and ``bound`` got, for each endpoint where they differ, to
    ``run_dir/endpoints.json`` (atomically: a resume never reads half of it)."""
    resolved = {
        f"transport.{key}": {"asked": getattr(asked, key), "bound": getattr(bound, key)}
        for key in BOUND_KEYS
        if getattr(asked, key) != getattr(bound, key)
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{ENDPOINTS_FILE}.", dir=run_dir)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(resolved, f, indent=2)
            f.write("\n")
        os.replace(tmp, run_dir / ENDPOINTS_FILE)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def asked_again(run_dir: Path, transport: TransportConfig) -> TransportConfig:
    """``transport`` with each endpoint that still holds the port its run was given put back to
    what that run asked (``record``). A run directory without the file (a run of earlier versions,
    a fixed-port run), or with one that does not parse, changes nothing."""
    try:
        resolved = json.loads((run_dir / ENDPOINTS_FILE).read_text())
    except (OSError, ValueError):
        return transport
    if not isinstance(resolved, dict):
        return transport
    again = {key: str(getattr(transport, key)) for key in BOUND_KEYS}
    for key in BOUND_KEYS:
        entry = resolved.get(f"transport.{key}")
        if not isinstance(entry, dict) or not isinstance(entry.get("asked"), str):
            continue
        if entry.get("bound") == again[key]:  # as the run was given it: not edited since
            again[key] = entry["asked"]
    return replace(
        transport,
        samples=again["samples"],
        weights=again["weights"],
        heartbeat=again["heartbeat"],
        control=again["control"],
    )
