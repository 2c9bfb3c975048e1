"""The watch-only supervisor keeps a bounded table (issue 23, items 7 and 11): heartbeats under ever
new ids, from any peer that reaches the heartbeat port, are counted and dropped past the config's
roles plus ``supervisor.extra_slots``, and the roles the config expects always get their slot."""

from __future__ import annotations

import io
from pathlib import Path

from tests.conftest import tiny_config
from zmqrl.supervisor.watch import Watcher
from zmqrl.transport.wire import HeartbeatMsg


def hb(role: str, index: int, pid: int = 4242) -> HeartbeatMsg:
    return HeartbeatMsg(role, index, pid, 0.0, "running", {"progress": 1}, {})


def test_heartbeats_from_random_ids_cannot_grow_the_slot_table_without_bound(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, actor__num_actors=3, supervisor__extra_slots=4)
    watcher = Watcher(cfg, out=io.StringIO(), dashboard=False)
    watcher._t0 = 0.0
    for i in range(10_000):
        watcher._slot_for(hb("actor", 1000 + i, pid=10_000 + i), now=1.0)
    assert len(watcher.slots) == 4, "only the extra slots are taken by unexpected ids"
    assert watcher.unknown_senders.count == 10_000 - 4
    # The config's own roles still join, however full the extras are.
    for role, index in (("learner", 0), ("actor", 0), ("actor", 1), ("actor", 2)):
        assert watcher._slot_for(hb(role, index), now=2.0) is not None
    assert len(watcher.slots) == 4 + 4
    assert watcher._own_counts() == {"dropped_heartbeats": 10_000 - 4}
