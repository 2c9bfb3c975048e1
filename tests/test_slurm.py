"""`zmqrl slurm`'s script on a real Slurm: a one-node cluster of this machine (Debian's slurm-wlm),
started by the test, runs a tiny CartPole job submitted with sbatch.

The test writes a slurm.conf (cluster "test", this host as controller and as the one node with 2
CPUs, state and spool in the test's directory, ports from the OS, no cgroups: a container has
none), starts slurmctld and slurmd in the foreground, waits until the node is idle, submits the
script and waits for the job to end. It checks what a user would: the job COMPLETED with exit code
0, and the run directory holds the learner's max_updates, the actor's log and the job's keys.
Authentication is munge, with a key and a socket of the test's own: Slurm has no setting for the
address its daemons listen on, so for the test's few seconds they take connections from anywhere,
and only a munge credential keeps others from submitting jobs as root. Without munged, the test
falls back to auth/none where this Slurm version still has it. Every daemon and every process of
the job is ended in ``finally``.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest

from tests.conftest import REPO, tiny_overrides, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.heavy]
CONFIG = REPO / "configs" / "cartpole_dqn.yaml"
DAEMONS = ("slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "squeue", "scancel")
# Where Debian (and most builds) keep Slurm's plugins: auth_none.so is gone from newer versions.
AUTH_NONE_PLUGINS = ("/usr/lib/*/slurm-wlm/auth_none.so", "/usr/lib*/slurm*/auth_none.so")
NODE_UP_S = 60.0  # slurmd registering with slurmctld takes about 2 s here
JOB_DEADLINE_S = 150.0  # the job itself took about 8 s on the 2-core reference machine
POLL_S = 0.25  # between two sinfo / scontrol calls while waiting (each is a process)
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED"}


def tool(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin")


def free_port(count: int = 1) -> int:
    """A port with ``count`` - 1 free ports after it, on loopback, as far as the OS can tell now,
    below the kernel's ephemeral range: a port the OS hands out for binding port 0 can be taken by
    any outgoing connection in the seconds before the job binds it (a learner once found its
    weights port taken that way), one below that range only by another bind."""
    try:
        ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768  # Linux's default
    rng = random.SystemRandom()
    for _ in range(200):
        base = rng.randrange(10_000, ephemeral_low - count)
        socks = [socket.socket() for _ in range(count)]
        try:
            for offset, sock in enumerate(socks):
                sock.bind(("127.0.0.1", base + offset))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise AssertionError(f"no {count} consecutive free ports below {ephemeral_low}")


def throttled(check: Callable[[], bool]) -> Callable[[], bool]:
    """``check``, run at most every POLL_S: each call starts a Slurm client process."""
    last = [0.0]

    def poll() -> bool:
        if time.monotonic() - last[0] < POLL_S:
            return False
        last[0] = time.monotonic()
        return check()

    return poll


@dataclass
class Cluster:
    """A running Slurm on this machine: the environment its clients need and the processes to end."""

    root: Path
    env: dict[str, str]
    nodes: list[str]
    daemons: list[subprocess.Popen[bytes]] = field(default_factory=list)
    outputs: list[IO[bytes]] = field(default_factory=list)  # the daemons' stdout and stderr files

    @property
    def node(self) -> str:
        """The first node: where the batch script, the learner and the supervisor run."""
        return self.nodes[0]

    def client(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=60)

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (slurmctld keeps a finished job for MinJobAge, 300 s)."""
        out = self.client("scontrol", "show", "job", "--oneliner", job_id).stdout
        return dict(item.split("=", 1) for item in out.split() if "=" in item)


def slurm_conf(root: Path, nodes: list[str], auth: list[str]) -> str:
    """One slurmd per node, all on this machine (each with a port of its own): one node gets both
    CPUs, two get one each."""
    cpus = 2 // len(nodes)
    return "\n".join(
        [
            "ClusterName=test",
            f"SlurmctldHost={socket.gethostname().split('.')[0]}(127.0.0.1)",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"SlurmctldPort={free_port()}",
            *auth,
            f"StateSaveLocation={root / 'state'}",
            f"SlurmdSpoolDir={root / 'spool'}/%n",
            f"SlurmctldPidFile={root / 'slurmctld.pid'}",
            f"SlurmdPidFile={root / 'slurmd'}-%n.pid",
            f"SlurmctldLogFile={root / 'slurmctld.log'}",
            f"SlurmdLogFile={root / 'slurmd'}-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "ReturnToService=2",
            *(f"NodeName={n} NodeAddr=127.0.0.1 Port={free_port()} CPUs={cpus} State=UNKNOWN" for n in nodes),
            f"PartitionName=test Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]
    )


def marked_processes(marker: str) -> list[int]:
    """Processes whose environment holds ``marker``: the daemons, the slurmstepd they start (which
    inherit slurmd's environment) and the job's own processes (which inherit sbatch's)."""
    found = []
    needle = marker.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
    return found


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """One node: this host (its name is what the job script resolves; "localhost" when this host's
    name does not resolve)."""
    host = socket.gethostname().split(".")[0]
    try:
        socket.gethostbyname(host)
    except OSError:
        host = "localhost"
    yield from running_cluster(tmp_path, [host])


@pytest.fixture
def two_nodes(tmp_path: Path) -> Iterator[Cluster]:
    """Two nodes, two slurmd on this host: an allocation whose actors run on another node."""
    yield from running_cluster(tmp_path, ["zmqrl-n1", "zmqrl-n2"])


def running_cluster(tmp_path: Path, nodes: list[str]) -> Iterator[Cluster]:
    missing = [name for name in DAEMONS if tool(name) is None]
    if missing:
        pytest.skip(f"slurm-wlm is not installed (no {', '.join(missing)}): apt-get install slurm-wlm")
    if os.geteuid() != 0:
        pytest.skip("slurmd must run as root to start job steps")
    root = tmp_path / "slurm"
    for sub in ("state", *(f"spool/{node}" for node in nodes)):
        (root / sub).mkdir(parents=True)
    marker = f"ZMQRL_SLURM_TEST={root}"
    env = {
        **os.environ,
        "SLURM_CONF": str(root / "slurm.conf"),
        "ZMQRL_SLURM_TEST": str(root),
        "PATH": f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin",
    }
    munge_dir: str | None = None
    cluster = Cluster(root, env, nodes)
    try:
        if tool("munged") is not None:
            # munged wants its socket's directory searchable by all: not pytest's 0700 tmp_path.
            munge_dir = tempfile.mkdtemp(prefix="zmqrl-munge-")
            os.chmod(munge_dir, 0o755)
            key_dir = root / "munge"
            key_dir.mkdir(mode=0o700)
            (key_dir / "munge.key").write_bytes(os.urandom(1024))
            (key_dir / "munge.key").chmod(0o600)
            sock = f"{munge_dir}/munge.socket"
            munged = [
                tool("munged") or "munged",
                "-F",
                f"--socket={sock}",
                f"--log-file={root / 'munged.log'}",
            ]
            munged += [f"--key-file={key_dir / 'munge.key'}", f"--pid-file={key_dir / 'pid'}"]
            munged += [f"--seed-file={key_dir / 'seed'}"]
            cluster.daemons.append(
                subprocess.Popen(munged, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            )
            wait_until(lambda: Path(sock).exists(), 20, "munged's socket")
            auth = ["AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={sock}"]
        elif any(glob.glob(pattern) for pattern in AUTH_NONE_PLUGINS):
            auth = ["AuthType=auth/none", "CredType=cred/none"]
        else:
            pytest.skip("munged is not installed and this Slurm has no auth/none plugin")
        (root / "slurm.conf").write_text(slurm_conf(root, nodes, auth))
        conf = str(root / "slurm.conf")
        commands = {"slurmctld": [tool("slurmctld"), "-D", "-f", conf]}
        commands |= {f"slurmd-{n}": [tool("slurmd"), "-D", "-f", conf, "-N", n] for n in nodes}
        for name, cmd in commands.items():
            cluster.outputs.append(out := (root / f"{name}.out").open("wb"))
            cluster.daemons.append(subprocess.Popen([str(c) for c in cmd], env=env, stdout=out, stderr=out))

        def idle() -> bool:
            states = cluster.client("sinfo", "--noheader", "--Node", "--format=%t").stdout.split()
            return states == ["idle"] * len(nodes)

        try:
            wait_until(throttled(idle), NODE_UP_S, "the node to be idle in sinfo")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{daemon_logs(root)}") from None
        yield cluster
    finally:
        if any(d.poll() is None for d in cluster.daemons):
            cluster.client("scancel", "--full", "--user=root")
        for daemon in reversed(cluster.daemons):
            daemon.terminate()
            try:
                daemon.wait(timeout=15)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait(timeout=5)
        for pid in marked_processes(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for out in cluster.outputs:
            out.close()
        if munge_dir is not None:
            shutil.rmtree(munge_dir, ignore_errors=True)


def daemon_logs(root: Path, lines: int = 15) -> str:
    parts = []
    for path in sorted([*root.glob("slurm*.log"), *root.glob("slurm*.out")]):
        name = path.name
        if path.exists():
            parts.append(f"--- {name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:]))
    return "\n".join(parts)


@dataclass
class Submitted:
    """A job of the test: its id, run directory and output file."""

    job_id: str
    run_dir: Path
    output_path: Path
    started: float  # time.monotonic() just before sbatch

    def output(self) -> str:
        return self.output_path.read_text() if self.output_path.exists() else "(no job output)"

    def log(self, name: str) -> str:
        path = self.run_dir / "logs" / name
        return path.read_text(errors="replace") if path.exists() else "(none)"


def submit(cluster: Cluster, run_root: Path, **extra: object) -> Submitted:
    """Writes the script for a tiny CartPole run with one actor on the cluster's nodes, and submits it."""
    overrides = [s for s in tiny_overrides(run_root, **extra) if not s.startswith("transport.")]
    script = cluster.root / "cartpole.sbatch"
    job_out = cluster.root / "job-%j.out"
    cmd = [sys.executable, "-m", "zmqrl", "slurm", str(CONFIG), "--nodes", str(len(cluster.nodes))]
    cmd += ["--actors-per-node", "1"]
    cmd += ["--port-base", str(free_port(5)), "--output", str(script), f"--sbatch=--output={job_out}"]
    for item in overrides:
        cmd += ["--set", item]
    written = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert written.returncode == 0, written.stderr
    env = dict(cluster.env)
    if len(cluster.nodes) > 1 or not socket.gethostbyname(cluster.node).startswith("127."):
        # Tests bind loopback only, whatever this host's name means; the two "nodes" share it.
        env["ZMQRL_ADDRESS"] = "127.0.0.1"
    started = time.monotonic()
    done = subprocess.run(
        ["sbatch", "--parsable", str(script)], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr + daemon_logs(cluster.root)
    job_id = done.stdout.strip().split(";")[0]
    return Submitted(job_id, run_root / "t", Path(str(job_out).replace("%j", job_id)), started)


def wait_for_end(cluster: Cluster, job: Submitted) -> dict[str, str]:
    """The job's fields once it has ended."""
    fields: dict[str, str] = {}

    def ended() -> bool:
        fields.update(cluster.job(job.job_id))
        return fields.get("JobState") in FINAL_STATES

    wait_until(throttled(ended), JOB_DEADLINE_S, f"job {job.job_id} to end")
    return fields


def test_a_submitted_job_trains_to_max_updates_and_exits_0(
    cluster: Cluster, run_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = submit(cluster, run_root)
    fields = wait_for_end(cluster, job)
    took = time.monotonic() - job.started
    output = job.output()
    context = f"{fields}\n--- job output\n{output}\n--- learner log\n{job.log('learner-0.log')[-3000:]}"
    with capsys.disabled():  # how long a job takes is quoted in the docs: shown even when captured
        print(
            f"\nslurm job {job.job_id}: {fields.get('JobState')} exit {fields.get('ExitCode')} in "
            f"{took:.1f} s from sbatch to its end (Slurm's RunTime {fields.get('RunTime')})"
        )
    assert fields.get("JobState") == "COMPLETED" and fields.get("ExitCode") == "0:0", context

    run_dir = job.run_dir
    stats = json.loads((run_dir / "stats.json").read_text())
    assert stats["outcome"] == "finished", context
    assert stats["learner"]["state"] == "finished"
    assert stats["learner"]["updates"] == 300  # tiny_overrides' learner.max_updates
    assert [a["actor_id"] for a in stats["actors"]] == [0] and stats["actors"][0]["samples"] > 0
    assert (run_dir / "logs" / "actor-0.log").stat().st_size > 0  # written by the srun step
    assert (run_dir / "keys" / "server.key").exists()  # the job made keys, and every role used them
    assert json.loads((run_dir / "supervisor.json").read_text())["keys_dir"] == str(run_dir / "keys")
    assert f"learner on {cluster.node}" in output and "run ended with 0" in output, output
    assert not cluster.client("squeue", "--noheader").stdout.strip()  # no step left running


def test_the_signal_before_the_time_limit_stops_the_run_cleanly(cluster: Cluster, run_root: Path) -> None:
    # What Slurm sends the batch shell STOP_BEFORE_LIMIT_S before the time limit (#SBATCH --signal=B:TERM@...)
    job = submit(cluster, run_root, learner__max_updates=1_000_000)

    def training_or_ended() -> bool:
        return (
            "training:" in job.log("learner-0.log") or cluster.job(job.job_id).get("JobState") in FINAL_STATES
        )

    wait_until(throttled(training_or_ended), JOB_DEADLINE_S, "the learner to train")
    assert "training:" in job.log("learner-0.log"), f"{job.output()}\n{job.log('learner-0.log')[-3000:]}"
    # docs/slurm.md's way to see the dashboard: a step in the job's allocation, on its first node
    status = cluster.client(
        "srun", f"--jobid={job.job_id}", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={cluster.node}",
        sys.executable, "-m", "zmqrl", "status", str(job.run_dir),
    )  # fmt: skip
    assert status.returncode == 0 and "learner-0" in status.stdout, status.stdout + status.stderr
    signalled = cluster.client("scancel", "--batch", "--signal=TERM", job.job_id)
    assert signalled.returncode == 0, signalled.stderr
    fields = wait_for_end(cluster, job)
    output = job.output()
    context = f"{fields}\n--- job output\n{output}\n--- learner log\n{job.log('learner-0.log')[-3000:]}"
    assert "stop requested" in output, context
    assert fields.get("ExitCode") == "143:0", context  # stopped before it finished
    learner = json.loads((job.run_dir / "learner-stats.json").read_text())
    assert learner["state"] == "stopped", context  # on the stop broadcast, not killed
    assert list((job.run_dir / "checkpoints").glob("ckpt-*")), "no final checkpoint"
    assert not cluster.client("squeue", "--noheader").stdout.strip()
    daemons = {d.pid for d in cluster.daemons}
    left = [job_process(p) for p in marked_processes(f"ZMQRL_SLURM_TEST={cluster.root}") if p not in daemons]
    assert not [p for p in left if p], left


def job_process(pid: int) -> str:
    """``pid``'s command line and state if it is a live process of the job (a zmqrl role or srun),
    else "" (a slurmstepd, or gone)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""
    return f"{pid} {state} {cmdline}" if state != "Z" and ("zmqrl" in cmdline or "srun" in cmdline) else ""


def test_on_two_nodes_the_actors_run_on_the_second(two_nodes: Cluster, run_root: Path) -> None:
    job = submit(two_nodes, run_root)
    fields = wait_for_end(two_nodes, job)
    output = job.output()
    context = f"{fields}\n--- job output\n{output}\n--- learner log\n{job.log('learner-0.log')[-3000:]}"
    assert fields.get("JobState") == "COMPLETED" and fields.get("ExitCode") == "0:0", context
    assert "learner on zmqrl-n1 (127.0.0.1" in output and "1 actor(s) on 1 node(s)" in output, output
    stats = json.loads((job.run_dir / "stats.json").read_text())
    assert stats["learner"]["updates"] == 300 and stats["actors"][0]["samples"] > 0, context
    # The actors' step (JOBID.0) was launched by the second node's slurmd, not the first's.
    step = f"StepId={job.job_id}.0"
    assert step in (two_nodes.root / "slurmd-zmqrl-n2.log").read_text()
    assert step not in (two_nodes.root / "slurmd-zmqrl-n1.log").read_text()
