"""How much memory a run may use: read once, before the learner allocates replay.

Replay arrays are allocated with ``np.zeros``, whose pages the OS commits only when written, so a
capacity too large for the machine would not fail at start but hours later, when the buffer fills
and the kernel's OOM killer picks the learner. Checking the whole footprint against the memory
actually available turns that into an error at start that says what to change.

Why cgroups as well as ``/proc/meminfo``: inside a container, a Slurm job with ``--mem`` or a pod
with ``limits.memory``, ``/proc/meminfo`` still describes the whole node, while the kernel kills
the process once its *cgroup* reaches its limit. So the budget is the smaller of the host's
``MemAvailable`` and the room left under the cgroup's limit (cgroup v2 ``memory.max``, the smallest
along the path to the root, each level less what that level already uses; cgroup v1
``memory.limit_in_bytes`` and ``hierarchical_memory_limit``). Usage counts page cache, which the
kernel reclaims before it OOM-kills, so the inactive part of it (``inactive_file``) is not counted
as used. The budget says where its figure came from, so a refusal names the limit that bound it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from zmqrl.errors import ConfigError

# Where the kernel describes the process and its cgroups; parameters below, so tests give a fake tree.
PROC_ROOT = Path("/proc")
CGROUP_ROOT = Path("/sys/fs/cgroup")
# cgroup v1 says "no limit" with the largest page-aligned 64-bit count (9223372036854771712 with
# 4 KiB pages); any limit at least this large (an exbibyte) is taken as none.
V1_NO_LIMIT = 1 << 60
# cgroup v2 says "no limit" with this word in memory.max.
V2_NO_LIMIT = "max"
# The cgroup v1 controller's mount under CGROUP_ROOT, and cgroup v2's in the "hybrid" layout
# (v1 controllers plus a v2 tree that usually holds no memory controller).
V1_MEMORY_DIR = "memory"
V2_HYBRID_DIR = "unified"


class ReplayMemoryError(ConfigError, RuntimeError):
    """The configured replay would not fit in this machine's available memory.

    A ConfigError (lower ``replay.capacity``: exit 2 with one line), and still the RuntimeError
    that callers from before zmqrl.errors catch."""


@dataclass(frozen=True)
class MemoryBudget:
    """Bytes a new allocation may take, and the limit that figure comes from, in words."""

    available: int
    source: str  # e.g. "MemAvailable in /proc/meminfo", "cgroup memory.max 2.0 GiB of /sys/fs/..."


def available_memory(proc_root: Path = PROC_ROOT, cgroup_root: Path = CGROUP_ROOT) -> MemoryBudget | None:
    """The smaller of the host's available memory and the room under this process's cgroup limit
    (none set: the host's alone); None when neither can be read."""
    found = [b for b in (host_memory(proc_root), cgroup_memory(proc_root, cgroup_root)) if b is not None]
    return min(found, key=lambda b: b.available) if found else None


def host_memory(proc_root: Path = PROC_ROOT) -> MemoryBudget | None:
    """Memory the kernel could give a new allocation without swapping (Linux ``MemAvailable``);
    elsewhere the physical memory size; None when neither can be read."""
    meminfo = proc_root / "meminfo"
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return MemoryBudget(int(line.split()[1]) * 1024, f"MemAvailable in {meminfo}")
    except (OSError, ValueError, IndexError):
        pass
    try:
        physical = int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None
    return MemoryBudget(physical, "the physical memory size")


def cgroup_memory(proc_root: Path = PROC_ROOT, cgroup_root: Path = CGROUP_ROOT) -> MemoryBudget | None:
    """The room left under the memory limit of this process's cgroup (``proc_root/self/cgroup``
    names it; the tree is mounted at ``cgroup_root``); None without a limit or cgroups.

    v1 wins where its memory controller is listed (in the hybrid layout the v2 tree holds none)."""
    try:
        lines = (proc_root / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    v1_path = v2_path = None
    for line in lines:  # "ID:CONTROLLERS:PATH"; v2's is "0::PATH"
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2_path = parts[2]
        elif V1_MEMORY_DIR in parts[1].split(","):
            v1_path = parts[2]
    if v1_path is not None:
        return _v1_room(cgroup_root / V1_MEMORY_DIR, v1_path)
    if v2_path is not None:
        unified = (cgroup_root / "cgroup.controllers").exists()
        return _v2_room(cgroup_root if unified else cgroup_root / V2_HYBRID_DIR, v2_path)
    return None


def _own_dir(mount: Path, path: str) -> Path:
    """This process's cgroup directory under ``mount``. A container often sees its own cgroup as the
    mount's root while /proc/self/cgroup still names the host's path (cgroup v1, or v2 without a
    cgroup namespace), or a path above its namespace's root ("/../.."): then the root is ours."""
    relative = Path(path.strip("/"))
    if ".." in relative.parts:
        return mount
    own = mount / relative
    return own if own.is_dir() else mount


def _v2_room(mount: Path, path: str) -> MemoryBudget | None:
    """The least room under any ``memory.max`` from this cgroup up to the root: a parent's limit
    (a Slurm job's, above its step's) binds its children's usage together."""
    own = _own_dir(mount, path)
    levels = [own, *(parent for parent in own.parents if parent.is_relative_to(mount))]
    best: MemoryBudget | None = None
    for level in levels:
        limit = _read_int(level / "memory.max")
        if limit is None:  # "max", or no file (the root cgroup has none)
            continue
        inactive = _read_stat(level / "memory.stat").get("inactive_file")
        used = _used(_read_int(level / "memory.current"), inactive)
        room = MemoryBudget(
            max(0, limit - used),
            f"cgroup memory.max {format_bytes(limit)} of {level}, {format_bytes(used)} of it in use",
        )
        if best is None or room.available < best.available:
            best = room
    return best


def _v1_room(mount: Path, path: str) -> MemoryBudget | None:
    """The room under cgroup v1's limit: this cgroup's own or the smallest above it, which v1 reports
    as ``hierarchical_memory_limit`` in memory.stat."""
    own = _own_dir(mount, path)
    stat = _read_stat(own / "memory.stat")
    limits = {
        "memory.limit_in_bytes": _read_int(own / "memory.limit_in_bytes"),
        "hierarchical_memory_limit": stat.get("hierarchical_memory_limit"),
    }
    named = [(value, name) for name, value in limits.items() if value is not None and value < V1_NO_LIMIT]
    if not named:
        return None
    limit, name = min(named, key=lambda pair: pair[0])  # a tie: the cgroup's own limit
    # total_inactive_file counts the cgroup's children too, as usage_in_bytes does.
    inactive = stat.get("total_inactive_file", stat.get("inactive_file"))
    used = _used(_read_int(own / "memory.usage_in_bytes"), inactive)
    where = f"cgroup {name} {format_bytes(limit)} of {own}, {format_bytes(used)} of it in use"
    return MemoryBudget(max(0, limit - used), where)


def _used(usage: int | None, inactive_file: int | None) -> int:
    """What the kernel could not reclaim before an OOM kill: the usage less inactive page cache
    (an unreadable usage counts as none: the limit alone still bounds the budget)."""
    return max(0, (usage or 0) - (inactive_file or 0))


def _read_int(path: Path) -> int | None:
    """The number in a one-value cgroup file; None when absent, unreadable or "max" (no limit)."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == V2_NO_LIMIT:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _read_stat(path: Path) -> dict[str, int]:
    """A cgroup memory.stat ("name value" per line) as a mapping; empty when unreadable."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    stat: dict[str, int] = {}
    for line in lines:
        name, _, value = line.partition(" ")
        if value.strip().isdigit():
            stat[name] = int(value)
    return stat


def format_bytes(n: float) -> str:
    """``1536`` -> ``'1.5 KiB'``: sizes people read in logs and error messages."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
