"""zmqrl.replay.memory on fake /proc and /sys/fs/cgroup trees: inside a container, a Slurm job with
--mem or a pod with limits.memory, /proc/meminfo shows the whole node, so the budget the replay is
checked against must be the cgroup's room where a limit is set (v2 and v1), and must say where it
came from."""

from __future__ import annotations

from pathlib import Path

import pytest

from zmqrl.replay.memory import MemoryBudget, available_memory

GiB = 1 << 30
MiB = 1 << 20
# What cgroup v1 writes for "no limit" (PAGE_COUNTER_MAX pages of 4 KiB).
V1_UNLIMITED = "9223372036854771712"


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def fake_proc(tmp_path: Path, cgroup: str, host_available: int = 64 * GiB) -> Path:
    proc = tmp_path / "proc"
    write(
        proc,
        {
            "meminfo": f"MemTotal: {128 * GiB // 1024} kB\nMemAvailable: {host_available // 1024} kB\n",
            "self/cgroup": cgroup,
        },
    )
    return proc


def budget(tmp_path: Path, proc: Path) -> MemoryBudget:
    found = available_memory(proc, tmp_path / "cgroup")
    assert found is not None
    return found


def test_without_cgroups_the_host_decides(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, "")
    assert budget(tmp_path, proc) == MemoryBudget(64 * GiB, f"MemAvailable in {proc / 'meminfo'}")


def test_a_v2_limit_bounds_the_budget_less_what_is_in_use_but_not_reclaimable_cache(tmp_path: Path) -> None:
    cg = tmp_path / "cgroup"
    write(
        cg,
        {
            "cgroup.controllers": "cpu memory\n",
            "kubepods/pod1/memory.max": f"{2 * GiB}\n",
            "kubepods/pod1/memory.current": f"{800 * MiB}\n",
            "kubepods/pod1/memory.stat": f"anon {500 * MiB}\ninactive_file {300 * MiB}\nactive_file 0\n",
        },
    )
    got = budget(tmp_path, fake_proc(tmp_path, "0::/kubepods/pod1\n"))
    assert got.available == 2 * GiB - 500 * MiB  # 300 MiB of inactive page cache is reclaimed first
    assert got.source.startswith("cgroup memory.max 2.0 GiB of ") and "kubepods/pod1" in got.source
    assert "500.0 MiB of it in use" in got.source


def test_a_v2_parent_limit_binds_a_child_without_one(tmp_path: Path) -> None:
    """A Slurm job's limit sits on the job's cgroup; the step (and the process) live below it."""
    cg = tmp_path / "cgroup"
    write(
        cg,
        {
            "cgroup.controllers": "memory\n",
            "slurm/job_7/memory.max": f"{4 * GiB}\n",
            "slurm/job_7/memory.current": f"{3 * GiB}\n",  # the job's other steps use most of it
            "slurm/job_7/step_0/memory.max": "max\n",
            "slurm/job_7/step_0/memory.current": f"{100 * MiB}\n",
        },
    )
    got = budget(tmp_path, fake_proc(tmp_path, "0::/slurm/job_7/step_0\n"))
    assert got.available == 1 * GiB
    assert got.source == f"cgroup memory.max 4.0 GiB of {cg / 'slurm/job_7'}, 3.0 GiB of it in use"


def test_the_smaller_of_host_and_cgroup_wins(tmp_path: Path) -> None:
    cg = tmp_path / "cgroup"
    write(cg, {"cgroup.controllers": "memory\n", "memory.max": f"{32 * GiB}\n", "memory.current": "0\n"})
    proc = fake_proc(tmp_path, "0::/\n", host_available=3 * GiB)  # a container whose root is its cgroup
    assert budget(tmp_path, proc).available == 3 * GiB
    assert "MemAvailable" in budget(tmp_path, proc).source


def test_v2_without_a_limit_anywhere_is_the_hosts(tmp_path: Path) -> None:
    cg = tmp_path / "cgroup"
    write(cg, {"cgroup.controllers": "memory\n", "user.slice/memory.max": "max\n"})
    assert "MemAvailable" in budget(tmp_path, fake_proc(tmp_path, "0::/user.slice\n")).source


def test_a_v1_limit_with_the_containers_cgroup_mounted_as_the_root(tmp_path: Path) -> None:
    """Docker on cgroup v1: /proc/self/cgroup names the host's path, the mount is the container's own."""
    cg = tmp_path / "cgroup"
    write(
        cg,
        {
            "memory/memory.limit_in_bytes": f"{GiB}\n",
            "memory/memory.usage_in_bytes": f"{400 * MiB}\n",
            "memory/memory.stat": f"inactive_file 0\ntotal_inactive_file {100 * MiB}\n"
            f"hierarchical_memory_limit {GiB}\n",
        },
    )
    cgroup = "12:pids:/docker/abc\n4:memory:/docker/abc\n0::/\n"
    got = budget(tmp_path, fake_proc(tmp_path, cgroup))
    assert got.available == GiB - 300 * MiB
    assert got.source.startswith("cgroup memory.limit_in_bytes 1.0 GiB of ")


def test_a_v1_parent_limit_comes_from_hierarchical_memory_limit(tmp_path: Path) -> None:
    cg = tmp_path / "cgroup"
    write(
        cg,
        {
            "memory/slurm/uid_1/job_9/memory.limit_in_bytes": V1_UNLIMITED + "\n",
            "memory/slurm/uid_1/job_9/memory.usage_in_bytes": "0\n",
            "memory/slurm/uid_1/job_9/memory.stat": f"hierarchical_memory_limit {2 * GiB}\n",
        },
    )
    got = budget(tmp_path, fake_proc(tmp_path, "4:memory,cpuset:/slurm/uid_1/job_9\n"))
    assert got.available == 2 * GiB
    assert got.source.startswith("cgroup hierarchical_memory_limit 2.0 GiB")


def test_v1s_huge_no_limit_value_is_no_limit(tmp_path: Path) -> None:
    cg = tmp_path / "cgroup"
    write(
        cg,
        {
            "memory/memory.limit_in_bytes": V1_UNLIMITED + "\n",
            "memory/memory.usage_in_bytes": f"{GiB}\n",
            "memory/memory.stat": f"hierarchical_memory_limit {V1_UNLIMITED}\n",
        },
    )
    assert "MemAvailable" in budget(tmp_path, fake_proc(tmp_path, "4:memory:/\n")).source


@pytest.mark.parametrize("usage", ["", "garbage\n"])
def test_unreadable_cgroup_files_leave_the_limit_standing(tmp_path: Path, usage: str) -> None:
    cg = tmp_path / "cgroup"
    write(cg, {"cgroup.controllers": "memory\n", "memory.max": f"{GiB}\n", "memory.current": usage})
    assert budget(tmp_path, fake_proc(tmp_path, "0::/\n")).available == GiB


def test_usage_over_the_limit_leaves_no_room(tmp_path: Path) -> None:
    cg = tmp_path / "cgroup"
    write(cg, {"cgroup.controllers": "memory\n", "memory.max": f"{GiB}\n", "memory.current": f"{2 * GiB}\n"})
    assert budget(tmp_path, fake_proc(tmp_path, "0::/\n")).available == 0


def test_without_meminfo_the_physical_size_is_said_to_be_the_source(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    write(proc, {"self/cgroup": "0::/\n"})
    assert budget(tmp_path, proc).source == "the physical memory size"
