"""Two hosts on one machine: the learner in one Linux network namespace, the actors in another,
joined by a veth pair, talking TCP over CurveZMQ on the namespaces' own addresses.

This is the by-hand multi-host setup of docs/deployment.md "Running on several machines" for real: separate
network stacks, so loopback cannot stand in for the wire, the learner must bind a non-loopback
address (which needs keys), and the actors hold only the three key files an actor host is given.
A stranger on the actors' host, with no keys or with a key the learner never listed, is refused.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import processes_mentioning, tiny_overrides, wait_until
from zmqrl.transport.keys import create_keys

pytestmark = [pytest.mark.slow, pytest.mark.heavy]
REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "cartpole_dqn.yaml"

# Addresses and ports exist only inside the two namespaces the test makes, so fixed ones cannot
# collide with anything on the machine (or with a parallel run, which gets namespaces of its own).
LEARNER_IP, ACTORS_IP, PREFIX = "10.87.0.1", "10.87.0.2", 24
SAMPLES_EP, WEIGHTS_EP = f"tcp://{LEARNER_IP}:5555", f"tcp://{LEARNER_IP}:5556"
# Nobody listens here until the watch-only supervisor is in the test: heartbeats are dropped.
# The watch-only supervisor runs on the actors' host; the learner reaches it over the veth.
HEARTBEAT_EP, CONTROL_EP = f"tcp://{ACTORS_IP}:5557", f"tcp://{ACTORS_IP}:5558"
NUM_ACTORS = 2
MAX_UPDATES = 600
# Valid transitions each stranger socket tries to push (in messages of 4000), before any actor runs:
# had any been admitted, the learner's count would be above zero.
STRANGER_TRANSITIONS = 8000
STRANGER_LISTEN_S = 3.0  # the learner republishes weights every 0.2 s meanwhile
START_DEADLINE_S = 90.0  # torch imports in three processes on two shared cores
RUN_DEADLINE_S = 180.0

# A client on the actors' host without the keys: one plaintext PUSH/SUB pair and one with a fresh
# Curve pair the learner never authorized. It pushes valid samples and listens for weights, then
# prints what it saw and the public key the learner should report refusing.
STRANGER = """
import json, sys, time
import numpy as np, zmq, zmq.auth
from zmqrl.transport import wire
from zmqrl.types import TransitionBatch

samples_ep, weights_ep, server_key, seconds, total = sys.argv[1:6]
server_public, _ = zmq.auth.load_certificate(server_key)
ctx = zmq.Context()
public, secret = zmq.curve_keypair()

def socket(kind, curve):
    sock = ctx.socket(kind)
    sock.linger = 0
    if curve:
        sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = server_public, public, secret
    return sock

n = 4000
batch = TransitionBatch(
    obs=np.zeros((n, 4), np.float32), action=np.zeros(n, np.int64), reward=np.ones(n, np.float32),
    next_obs=np.zeros((n, 4), np.float32), discount=np.full(n, 0.99, np.float32))
queued, pushes, subs = 0, [], []  # every socket stays open until the end: closing drops its queue
for curve in (False, True):
    push = socket(zmq.PUSH, curve)
    pushes.append(push)
    push.connect(samples_ep)  # no IMMEDIATE: messages queue while a connection is pending
    seq, give_up = 0, time.monotonic() + 1.0  # a refused handshake drops the pipe: sends then block
    while seq < int(total) // n and time.monotonic() < give_up:
        try:
            push.send_multipart(wire.dump(wire.SamplesMsg(99, seq, 0, batch, [])), zmq.NOBLOCK)
            seq, queued = seq + 1, queued + n
        except zmq.Again:
            time.sleep(0.01)
    sub = socket(zmq.SUB, curve)
    sub.subscribe(b"")
    sub.connect(weights_ep)
    subs.append(sub)
received, end = 0, time.monotonic() + float(seconds)
while (left := end - time.monotonic()) > 0:
    for sub in subs:
        if sub.poll(int(min(left, 0.1) * 1000) + 1):
            sub.recv_multipart()
            received += 1
print(json.dumps({"queued": queued, "weights_received": received, "key": public.decode()}))
ctx.destroy(linger=0)
"""


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=15, check=False)


def _must(*args: str) -> None:
    done = _ip(*args)
    assert done.returncode == 0, f"`ip {' '.join(args)}` failed: {done.stderr.strip()}"


@dataclass
class Hosts:
    """Two namespaces joined by a veth pair, and every process the test started in them."""

    learner_ns: str
    actors_ns: str
    logs: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, ns: str, name: str, *args: str, supervised: bool = True) -> subprocess.Popen[bytes]:
        """``python ARGS`` inside ``ns`` (``ip netns exec`` execs it: the PID is the Python's);
        stdout to ``logs/NAME.out``, stderr (the log) to ``logs/NAME.log``."""
        out = (self.logs / f"{name}.out").open("wb")
        err = (self.logs / f"{name}.log").open("wb")
        with out, err:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", ns, sys.executable, *args],
                cwd=REPO,
                stdout=out,
                stderr=err,
                # Config comes from the arguments alone: ZMQRL_* variables of whoever runs the test
                # would be read as config (docs/configuration.md) and change the run.
                env={
                    **{k: v for k, v in os.environ.items() if not k.startswith("ZMQRL_")},
                    "PYTHONUNBUFFERED": "1",
                    # Roles watch (and wait for) the watch-only supervisor, as under an orchestrator.
                    **({"ZMQRL_SUPERVISED": "1"} if supervised else {}),
                },
            )
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def output(self, name: str) -> str:
        return (self.logs / f"{name}.out").read_text(errors="replace")

    def stop_all(self) -> None:
        """SIGKILL whatever is still running (a failed test), then reap everything."""
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGKILL)
        for proc in self.procs:
            proc.wait(timeout=10)


def _namespaces() -> set[str]:
    return {line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()}


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Hosts]:
    """Make the two "hosts"; at teardown, even after a failure, kill what runs in them, delete them
    (which destroys the veth pair) and check nothing of them is left."""
    if shutil.which("ip") is None:
        pytest.skip("network namespaces need iproute2's `ip`, which is not installed")
    token = secrets.token_hex(3)
    learner_ns, actors_ns = f"zmqrl-{token}-learner", f"zmqrl-{token}-actors"
    veth_l, veth_a = f"zq{token}l", f"zq{token}a"  # interface names are at most 15 characters
    probe = _ip("netns", "add", learner_ns)
    if probe.returncode != 0:
        if os.geteuid() != 0 or "not permitted" in probe.stderr or "denied" in probe.stderr:
            pytest.skip(f"network namespaces are not permitted here: {probe.stderr.strip()}")
        pytest.fail(f"`ip netns add` failed: {probe.stderr.strip()}")
    made = [learner_ns]
    logs = tmp_path / "logs"
    logs.mkdir()
    hosts = Hosts(learner_ns, actors_ns, logs)
    try:
        _must("netns", "add", actors_ns)
        made.append(actors_ns)
        # Created inside the learner's namespace with its peer moved straight to the actors': no
        # interface or address ever appears in the machine's own namespace.
        _must("-n", learner_ns, "link", "add", veth_l, "type", "veth", "peer", "name", veth_a,
              "netns", actors_ns)  # fmt: skip
        for ns, dev, ip in ((learner_ns, veth_l, LEARNER_IP), (actors_ns, veth_a, ACTORS_IP)):
            _must("-n", ns, "addr", "add", f"{ip}/{PREFIX}", "dev", dev)
            _must("-n", ns, "link", "set", dev, "up")
            _must("-n", ns, "link", "set", "lo", "up")
        yield hosts
    finally:
        hosts.stop_all()
        for ns in made:
            for pid in _ip("netns", "pids", ns).stdout.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            _ip("netns", "del", ns)
    assert not {learner_ns, actors_ns} & _namespaces(), "a namespace outlived the test"
    assert veth_l not in _ip("link").stdout and veth_a not in _ip("link").stdout
    assert not processes_mentioning(str(tmp_path)), "a process outlived the test"


def _sets(items: list[str]) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def _actor_host_keys(keys: Path, dest: Path) -> Path:
    """What docs/deployment.md says to copy to an actor host: exactly server.key and the actors' pair
    (actor.key, actor.key_secret: the key the supervisor lets speak as an actor)."""
    dest.mkdir(mode=0o700)
    for name in ("server.key", "actor.key", "actor.key_secret"):
        shutil.copy2(keys / name, dest / name)
    return dest


def _json_line(text: str) -> dict[str, Any]:
    """The JSON object a role prints on stdout when it exits (the last such line)."""
    lines = [line for line in text.splitlines() if line.startswith("{")]
    assert lines, f"no JSON stats in the output:\n{text}"
    parsed: dict[str, Any] = json.loads(lines[-1])
    return parsed


def _progress(log: str) -> list[int]:
    """The samples count of each of the learner's progress lines ("updates U/N | samples S (...")."""
    return [int(m.group(1)) for m in re.finditer(r"updates \d+/\d+ \| samples (\d+) ", log)]


def _wait_exit(hosts: Hosts, name: str, proc: subprocess.Popen[bytes], deadline: float) -> int:
    try:
        return proc.wait(timeout=max(deadline - time.monotonic(), 1.0))
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{name} still running at the deadline; its log:\n{hosts.log(name)}") from None


def test_learner_and_actors_on_two_hosts_train_over_curve_and_strangers_are_refused(
    hosts: Hosts, tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    create_keys(keys)
    actor_keys = _actor_host_keys(keys, tmp_path / "actor-host-keys")
    run_dir = tmp_path / "runs"
    common = [
        item
        for item in tiny_overrides(run_dir)
        if not item.startswith(("transport.", "actor.max_steps_per_s", "learner.max_updates"))
    ]
    common += [
        f"learner.max_updates={MAX_UPDATES}",
        "learner.min_replay_size=500",
        "actor.max_steps_per_s=1000",  # three processes share two cores: leave the learner some
        f"transport.samples={SAMPLES_EP}",
        f"transport.weights={WEIGHTS_EP}",
        f"transport.heartbeat={HEARTBEAT_EP}",
        f"transport.control={CONTROL_EP}",
    ]
    started = time.monotonic()
    learner = hosts.start(
        hosts.learner_ns, "learner", "-m", "zmqrl", "learner", str(CONFIG),
        *_sets([*common, f"transport.keys_dir={keys}"]),
    )  # fmt: skip
    wait_until(
        lambda: "learner up:" in hosts.log("learner") or learner.poll() is not None,
        START_DEADLINE_S,
        "the learner to bind its namespace address",
    )
    assert learner.poll() is None, f"the learner exited early:\n{hosts.log('learner')}"
    assert f"samples {SAMPLES_EP}" in hosts.log("learner")

    # The watch-only supervisor, on the actors' host: it binds, so it holds the server's secret.
    supervisor = hosts.start(
        hosts.actors_ns, "supervisor", "-m", "zmqrl", "supervise", str(CONFIG),
        *_sets([*common, f"transport.keys_dir={keys}"]), supervised=False,
    )  # fmt: skip
    wait_until(
        lambda: "learner-0 joined" in hosts.output("supervisor") or supervisor.poll() is not None,
        START_DEADLINE_S,
        "the supervisor to hear the learner across the veth",
    )
    assert supervisor.poll() is None, hosts.output("supervisor") + hosts.log("supervisor")

    # A stranger on the actors' host, before any actor exists: refused both ways. The learner names
    # its unlisted key, none of the weights it republishes meanwhile reach either of the stranger's
    # subscribers, and none of its transitions are counted: the learner's next progress line, after
    # the stranger has left, still says it has received nothing.
    stranger = hosts.start(
        hosts.actors_ns, "stranger", "-c", STRANGER, SAMPLES_EP, WEIGHTS_EP, str(keys / "server.key"),
        str(STRANGER_LISTEN_S), str(STRANGER_TRANSITIONS),
    )  # fmt: skip
    assert _wait_exit(hosts, "stranger", stranger, time.monotonic() + START_DEADLINE_S) == 0, hosts.log(
        "stranger"
    )
    seen = _json_line(hosts.output("stranger"))
    assert seen["weights_received"] == 0, "a client without the keys received weights"
    assert any("refused" in line and seen["key"] in line for line in hosts.log("learner").splitlines())
    progress_so_far = len(_progress(hosts.log("learner")))
    wait_until(
        lambda: len(_progress(hosts.log("learner"))) > progress_so_far or learner.poll() is not None,
        10.0,
        "a learner progress line after the stranger left",
    )
    counted = "the learner counted samples from a client without keys"
    assert learner.poll() is None and "training:" not in hosts.log("learner"), counted
    assert _progress(hosts.log("learner"))[-1] == 0, counted

    actor_args = ["-m", "zmqrl", "actor", str(CONFIG), *_sets([*common, f"transport.keys_dir={actor_keys}"])]
    actors = [
        hosts.start(hosts.actors_ns, f"actor-{i}", *actor_args, "--id", str(i)) for i in range(NUM_ACTORS)
    ]
    deadline = started + RUN_DEADLINE_S
    codes = {"learner": _wait_exit(hosts, "learner", learner, deadline)}
    for i, proc in enumerate(actors):
        codes[f"actor-{i}"] = _wait_exit(hosts, f"actor-{i}", proc, deadline)
    codes["supervisor"] = _wait_exit(hosts, "supervisor", supervisor, deadline)
    elapsed = time.monotonic() - started
    logs = {name: hosts.log(name) for name in codes}
    watched = hosts.output("supervisor")
    assert codes == dict.fromkeys(codes, 0), f"exit codes {codes}; logs:\n{logs}"

    # The learner trained to the end on samples that crossed the veth.
    learner_stats = _json_line(hosts.output("learner"))["learner"]
    saved = json.loads((run_dir / "t" / "learner-stats.json").read_text())
    assert saved["updates"] == learner_stats["updates"] == MAX_UPDATES
    assert learner_stats["samples"] > 0 and learner_stats["bad_messages"] == 0

    # Each actor sent samples, and weights the learner trained came back to it; each left when the
    # learner's end was announced.
    actor_stats = [_json_line(hosts.output(f"actor-{i}")) for i in range(NUM_ACTORS)]
    for i, stats in enumerate(actor_stats):
        assert stats["actor"] == i
        assert stats["samples"] > 0, stats
        assert stats["weights_version"] > 1 and stats["weights_loaded"] > 1, stats
        log_i = logs[f"actor-{i}"]  # the learner's own announcement, or the supervisor's broadcast after it
        assert "stop announced by the learner" in log_i or "stop received from supervisor" in log_i

    # What the learner read came from the actors alone (at most what they sent: some may still have
    # been in flight when it finished).
    assert learner_stats["samples"] <= sum(int(s["samples"]) for s in actor_stats)

    # The watch-only supervisor heard every process across the hosts, stopped when the learner
    # finished, and reports what they reported.
    for name in ("learner-0", *(f"actor-{i}" for i in range(NUM_ACTORS))):
        assert f"{name} joined" in watched, watched
    assert "learner finished; stopping actors" in watched, watched
    summary = json.loads((run_dir / "t" / "stats.json").read_text())
    assert summary["learner"]["updates"] == MAX_UPDATES
    assert sorted(row["actor_id"] for row in summary["actors"]) == list(range(NUM_ACTORS))
    assert all(row["samples"] > 0 for row in summary["actors"]), summary["actors"]
    print(f"multi-host run: {elapsed:.1f} s, learner {learner_stats}, actors {actor_stats}")
