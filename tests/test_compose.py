"""docker/compose.yaml, for real: a real engine builds docker/Dockerfile and runs the whole topology.

The image is built from the wheelhouse .ci/docker-setup.sh makes on the host (no network, no
registry), on the Debian base that script imports; the build leaves no dangling image once the
documented prune ran. The run: the watch-only supervisor, the learner, two actors (ZMQRL_ACTORS=2),
the evaluator and TensorBoard, on host networking (the docker/compose.host.yaml override) with
ports the OS picked, so the traffic stays on loopback and parallel runs never collide. The test
watches every healthcheck turn healthy, SIGKILLs one actor's role process (its container's init
passes the death on, so the engine sees a failure and `restart: on-failure` applies, as it would
for an OOM kill), waits for that container to come back under the same actor id and step again,
SIGSTOPs the other actor's role (a hung process: its own watchdog is stopped too) and sees the
image's init end it and the engine replace it within the documented time, `docker kill`s an actor
and sees it stay down until `up` starts it again (the engine's rule for a kill through its API),
lets the learner finish (the supervisor then stops everyone and exits 0), checks on the run volume
that samples and weights flowed, that evaluation ran and that the supervisor counted every restart,
and brings it all down: no container, network, volume or process of the project is left, whatever
happened before.

It needs root and a container engine. .ci/run calls .ci/docker-setup.sh first; run alone as root,
the test calls that script itself (idempotent). It skips only where no engine can start.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from zmqrl.config import load_config

pytestmark = [pytest.mark.slow, pytest.mark.heavy]

ROOT = Path(__file__).resolve().parent.parent
SETUP = ROOT / ".ci" / "docker-setup.sh"
COMPOSE_FILES = [ROOT / "docker" / "compose.yaml", ROOT / "docker" / "compose.host.yaml"]
WHEELHOUSE = "build/wheelhouse"  # relative to the build context, as docker/compose.yaml expects
IMAGE = "zmqrl:compose-test"
BUILD_CACHE = "zmqrl:compose-test-build-cache"  # the build stage, named (docker/README.md "Build it")
RUN_NAME = "compose_test"
ACTORS = 2
# Long enough for the kill, the hang and the docker kill to happen mid-run (they take ~25 s): the
# replay ratio ties updates to the capped actors' steps (2 x 300 steps/s x 8 / 64 = 75 updates/s),
# so 4000 updates take a minute or more.
MAX_UPDATES = 4000
SETUP_TIMEOUT = 1200.0  # a first run installs packages, debootstraps and builds the wheelhouse
BUILD_TIMEOUT = 900.0
HEALTHY_TIMEOUT = 180.0
RESTART_TIMEOUT = 120.0
# docker/README.md "When a role hangs": a role that stops beating is killed by its container's init
# 2 x supervisor.heartbeat_timeout (6 s) after its last beat and its container restarted; a new
# actor steps again once it has started and holds the current weights (seconds more). The bound
# the README gives, from SIGSTOP to the replacement stepping:
HUNG_REPLACED_WITHIN = 60.0
FINISH_TIMEOUT = 300.0
DOWN_TIMEOUT = 120.0

# Settings of the short run, as the environment variables a user would set.
SHORT_RUN = {
    "ZMQRL_RUN__NAME": RUN_NAME,
    "ZMQRL_LEARNER__MAX_UPDATES": str(MAX_UPDATES),
    "ZMQRL_LEARNER__MIN_REPLAY_SIZE": "500",
    "ZMQRL_LEARNER__SAMPLES_PER_INSERT": "8",
    "ZMQRL_LEARNER__CHECKPOINT_INTERVAL": "1000",
    "ZMQRL_ACTOR__MAX_STEPS_PER_S": "300",
    "ZMQRL_EVALUATOR__INTERVAL_SECONDS": "2",
    "ZMQRL_EVALUATOR__EPISODES": "3",
}
ROLES = ("supervisor", "learner", "actor", "evaluator")


def _docker_cli() -> str | None:
    """Debian's client where it is installed: it matches Debian's dockerd (another may be on PATH)."""
    return "/usr/bin/docker" if os.access("/usr/bin/docker", os.X_OK) else shutil.which("docker")


def _engine_answers(docker: str | None) -> bool:
    if docker is None:
        return False
    try:
        return subprocess.run([docker, "info"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="module")
def engine() -> str:
    """The docker client of an engine that answers, with the base image and wheelhouse in place."""
    setup_note = ""
    if os.geteuid() == 0 and SETUP.exists():
        # Idempotent: seconds when everything is in place; installs and starts what is missing.
        done = subprocess.run(
            ["bash", str(SETUP)], cwd=ROOT, capture_output=True, text=True, timeout=SETUP_TIMEOUT
        )
        last_lines = (done.stdout + done.stderr).strip().splitlines()[-1:] or [""]
        setup_note = f" (.ci/docker-setup.sh: {last_lines[0]})"
        if done.returncode != 0 and _engine_answers(_docker_cli()):
            pytest.fail(f".ci/docker-setup.sh failed with an engine up:\n{done.stdout}\n{done.stderr}")
    docker = _docker_cli()
    if not _engine_answers(docker):
        why = "not root, so .ci/docker-setup.sh cannot start one" if os.geteuid() != 0 else "none started"
        pytest.skip(f"no container engine answers `docker info`: {why}{setup_note}")
    assert docker is not None
    if shutil.which("docker-compose") is None:
        pytest.fail("an engine answers but docker-compose is missing: run .ci/docker-setup.sh")
    if not (ROOT / WHEELHOUSE).is_dir():
        pytest.fail(f"no {WHEELHOUSE}: run .ci/docker-setup.sh (as root) to make it")
    return docker


def _free_ports(n: int) -> list[int]:
    """n distinct free ports on 127.0.0.1, held open together so the OS gives different ones."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _override(path: Path, short_run: dict[str, str] = SHORT_RUN) -> Path:
    """The test's own override: the short run for every role, healthchecks every 2 s."""
    env = "\n".join(f"  {k}: {json.dumps(v)}" for k, v in short_run.items())
    roles = "\n".join(f"  {r}: {{environment: *short, healthcheck: *fast}}" for r in ROLES)
    path.write_text(
        f"x-short: &short\n{env}\n"
        "x-fast: &fast\n  interval: 2s\n  start_period: 90s\n  retries: 3\n"
        f"services:\n{roles}\n  tensorboard: {{healthcheck: *fast}}\n"
    )
    return path


class Project:
    """One compose project: its commands, its containers, and what it leaves behind."""

    def __init__(self, docker: str, name: str, files: list[Path], env: dict[str, str]) -> None:
        self.docker = docker
        self.name = name
        self.base = ["docker-compose", "-p", name, *(a for f in files for a in ("-f", str(f)))]
        # Compose builds through the engine's API itself, not through whatever client is on PATH.
        self.env = {**os.environ, **env, "COMPOSE_DOCKER_CLI_BUILD": "0"}
        self.host_pids: set[int] = set()  # every role process seen, for the leftovers check

    def compose(self, *args: str, timeout: float = 120.0, check: bool = True) -> str:
        done = subprocess.run(
            [*self.base, *args], cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
            )
        return done.stdout + done.stderr

    def docker_out(self, *args: str) -> str:
        return subprocess.run(
            [self.docker, *args], capture_output=True, text=True, timeout=60, check=True
        ).stdout.strip()

    def ids(self, kind: str = "container") -> list[str]:
        label = f"label=com.docker.compose.project={self.name}"
        args = ["ps", "-aq"] if kind == "container" else [kind, "ls", "-q"]
        return self.docker_out(*args, "--filter", label).split()

    def containers(self) -> dict[str, dict[str, Any]]:
        """Name -> `docker inspect` of every container of the project."""
        ids = self.ids()
        if not ids:
            return {}
        found = json.loads(self.docker_out("inspect", *ids))
        for c in found:
            if c["State"]["Pid"]:
                self.host_pids.add(c["State"]["Pid"])
        return {c["Name"].lstrip("/"): c for c in found}

    def service(self, name: str) -> list[dict[str, Any]]:
        return [
            c
            for c in self.containers().values()
            if c["Config"]["Labels"]["com.docker.compose.service"] == name
        ]

    def volume_dir(self, volume: str = "runs") -> Path:
        return Path(self.docker_out("volume", "inspect", "-f", "{{.Mountpoint}}", f"{self.name}_{volume}"))

    def down(self) -> dict[str, list[str]]:
        """`compose down --volumes`, then remove whatever it missed; returns what is still left."""
        container_ids = [c["Id"] for c in self.containers().values()]
        self.compose(
            "down", "--volumes", "--remove-orphans", "--timeout", "20", timeout=DOWN_TIMEOUT, check=False
        )
        for kind, rm in (
            ("container", ["rm", "-f", "-v"]),
            ("network", ["network", "rm"]),
            ("volume", ["volume", "rm", "-f"]),
        ):
            left = self.ids(kind)
            if left:
                subprocess.run([self.docker, *rm, *left], capture_output=True, timeout=120)
        return {
            "containers": self.ids(),
            "networks": self.ids("network"),
            "volumes": self.ids("volume"),
            "processes": _leftover_processes(self.host_pids, container_ids),
        }

    def health_record(self, container: str) -> dict[str, Any]:
        return json.loads(self.docker_out("exec", container, "cat", "/tmp/zmqrl-health.json"))

    def logs(self, container: str) -> str:
        done = subprocess.run([self.docker, "logs", container], capture_output=True, text=True, timeout=60)
        return done.stdout + done.stderr


def _role_pid(container: dict[str, Any]) -> int:
    """The host PID of the role process: the child of the container's init (its pid 1)."""
    init = container["State"]["Pid"]
    children = Path(f"/proc/{init}/task/{init}/children").read_text().split()
    assert len(children) == 1, f"the init runs one role, found children {children}"
    return int(children[0])


def _stepping(project: Project, name: str, after: float = 0.0) -> dict[str, Any] | None:
    """The health record of a role that has beaten since ``after`` and made progress, else None."""
    try:
        record = project.health_record(name)
    except subprocess.CalledProcessError:  # between a restart and the first beat
        return None
    return record if record["progress"] > 0 and record["time"] > after else None


def _exited(project: Project, name: str) -> bool:
    state = project.containers()[name]["State"]
    return bool(state["Status"] == "exited" and not state["Restarting"])


def _health(c: dict[str, Any]) -> str:
    return str((c["State"].get("Health") or {}).get("Status", "none"))


def _wait(what: str, predicate: Any, timeout: float, project: Project) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail with the states seen last."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(0.5)
    states = {
        n: (c["State"]["Status"], _health(c), c["RestartCount"]) for n, c in project.containers().items()
    }
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; containers: {states}")


def _dangling(docker: str) -> list[str]:
    """Untagged images of this project's builds (the label every stage of docker/Dockerfile has)."""
    return subprocess.run(
        [docker, "images", "-q", "--filter", "dangling=true", "--filter", "label=org.zmqrl.stage"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.split()


def _name_the_build_cache_and_prune(project: Project) -> None:
    """docker/README.md "Build it", keeping the cache: tag the newest build stage (the leaf of the
    build just made), then prune what is left untagged: nothing dangling of the project stays, and
    the next build still finds its layers."""
    newest = project.docker_out(
        "images", "-q", "--filter", "dangling=true", "--filter", "label=org.zmqrl.stage=build"
    ).split()[:1]
    if newest:
        project.docker_out("tag", newest[0], BUILD_CACHE)
    project.docker_out("image", "prune", "-f", "--filter", "label=org.zmqrl.stage")
    assert _dangling(project.docker) == [], "the build left dangling images after the documented prune"


def _leftover_processes(pids: set[int], container_ids: list[str]) -> list[str]:
    """Role processes still alive, and engine shims still serving one of the containers."""
    left = [f"pid {p}" for p in pids if Path(f"/proc/{p}").exists()]
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if any(cid in cmd for cid in container_ids):
                left.append(f"pid {proc.name}: {cmd[:120]}")
    return left


def _project(engine: str, tmp_path: Path, short_run: dict[str, str], extra_env: dict[str, str]) -> Project:
    ports = _free_ports(5)
    env = {
        **extra_env,
        "ZMQRL_IMAGE": IMAGE,
        "ZMQRL_WHEELHOUSE": WHEELHOUSE,
        "ZMQRL_ACTORS": str(ACTORS),
        **{
            f"ZMQRL_{k}_PORT": str(p)
            for k, p in zip(("SAMPLES", "WEIGHTS", "HEARTBEAT", "CONTROL", "TENSORBOARD"), ports, strict=True)
        },
    }
    name = f"zmqrltest{os.getpid()}{uuid.uuid4().hex[:6]}"
    return Project(engine, name, [*COMPOSE_FILES, _override(tmp_path / "short-run.yaml", short_run)], env)


@pytest.fixture()
def project(engine: str, tmp_path: Path) -> Iterator[Project]:
    proj = _project(engine, tmp_path, SHORT_RUN, {})
    try:
        yield proj
    finally:
        proj.down()  # again, for a test that failed before its own `down`: nothing may be left


# The on-policy family under compose: the same services on configs/cartpole_appo.yaml, picked by
# ZMQRL_CONFIG in compose's own environment, as a user picks it.
APPO_RUN = {
    "ZMQRL_RUN__NAME": RUN_NAME,
    "ZMQRL_LEARNER__MAX_UPDATES": "60",
    "ZMQRL_ACTOR__ENVS_PER_ACTOR": "4",
    "ZMQRL_ACTOR__MAX_STEPS_PER_S": "2000",
    "ZMQRL_EVALUATOR__INTERVAL_SECONDS": "2",
    "ZMQRL_EVALUATOR__EPISODES": "3",
}


@pytest.fixture()
def appo_project(engine: str, tmp_path: Path) -> Iterator[Project]:
    proj = _project(engine, tmp_path, APPO_RUN, {"ZMQRL_CONFIG": "configs/cartpole_appo.yaml"})
    try:
        yield proj
    finally:
        proj.down()


def test_compose_topology_trains_survives_a_killed_actor_and_leaves_nothing(project: Project) -> None:
    t0 = time.monotonic()
    timings: dict[str, float] = {}
    try:
        project.compose("build", "--force-rm", "supervisor", timeout=BUILD_TIMEOUT)
        _name_the_build_cache_and_prune(project)
        timings["build"] = time.monotonic() - t0
        project.compose("up", "-d", "--no-build")  # ZMQRL_ACTORS=2: two replicas, a ladder of two

        # Every service up and healthy: each role's own heartbeat says it is alive and progressing.
        expected = len(ROLES) - 1 + ACTORS + 1  # supervisor, learner, evaluator, actors, tensorboard

        def all_healthy() -> bool:
            cs = project.containers()
            return len(cs) == expected and all(_health(c) == "healthy" for c in cs.values())

        _wait("every container healthy", all_healthy, HEALTHY_TIMEOUT, project)
        timings["healthy"] = time.monotonic() - t0
        actors = sorted(project.service("actor"), key=lambda c: c["Name"])
        ids_by_container = {
            c["Name"].lstrip("/"): project.health_record(c["Name"].lstrip("/"))["id"] for c in actors
        }
        ids = set(ids_by_container.values())
        assert ids == set(range(ACTORS)), f"scaled actors must claim distinct ids, got {ids}"

        # SIGKILL one actor's role process from the host: its container's init exits 137, the
        # engine sees a failure and restarts the container.
        victim = actors[0]
        name, old_pid = victim["Name"].lstrip("/"), victim["State"]["Pid"]
        old_id = project.health_record(name)["id"]
        killed_at = time.time()
        os.kill(_role_pid(victim), signal.SIGKILL)

        def restarted_and_healthy() -> bool:
            c = project.containers()[name]
            return (
                c["RestartCount"] >= 1
                and c["State"]["Running"]
                and c["State"]["Pid"] != old_pid
                and _health(c) == "healthy"
            )

        _wait(f"{name} restarted and healthy again", restarted_and_healthy, RESTART_TIMEOUT, project)

        # Rejoined: stepping again (a replaced actor steps only once it holds the learner's
        # current weights), under its predecessor's id, which the kernel freed when it died.
        record = _wait(f"{name} stepping again", lambda: _stepping(project, name), RESTART_TIMEOUT, project)
        timings["rejoined"] = time.monotonic() - t0
        assert record["id"] == old_id, "the replacement must get its predecessor's id back"
        assert record["time"] > killed_at
        assert project.containers()[name]["State"]["Pid"] != old_pid
        learner = project.service("learner")[0]
        assert learner["State"]["Running"], "a killed actor must not take the learner down"

        # The watch-only supervisor answers `zmqrl status` like launch's: every role, with the host
        # it runs on (the test's compose shares the host's network, so one host name for all).
        supervisor = project.service("supervisor")[0]["Name"].lstrip("/")
        status = json.loads(
            project.docker_out("exec", supervisor, "zmqrl", "status", f"/runs/{RUN_NAME}", "--json")
        )
        rows = {(p["role"], p["id"]): p for p in status["processes"]}
        assert {("learner", 0), ("evaluator", 0), *(("actor", i) for i in range(ACTORS))} <= rows.keys(), rows
        assert all(p["host"] for p in rows.values()) and rows[("learner", 0)]["state"] == "running", rows
        timings["status"] = time.monotonic() - t0

        # A hung actor: SIGSTOP its role process (its watchdog and heartbeat threads stop with it).
        # Compose does not act on health; the image's init (pid 1) sees the beats stop, kills the
        # role and exits 3, and `restart: on-failure` brings a new actor that trains again.
        hung = actors[1]
        hung_name = hung["Name"].lstrip("/")
        hung_restarts, hung_id = hung["RestartCount"], project.health_record(hung_name)["id"]
        stopped_at = time.monotonic()
        os.kill(_role_pid(hung), signal.SIGSTOP)

        def replaced_and_stepping() -> dict[str, Any] | None:
            c = project.containers()[hung_name]
            if c["RestartCount"] <= hung_restarts or not c["State"]["Running"]:
                return None
            return _stepping(project, hung_name, after=stopped_wall)

        stopped_wall = time.time()
        record = _wait(f"{hung_name} replaced", replaced_and_stepping, HUNG_REPLACED_WITHIN, project)
        timings["hung_replaced_after"] = time.monotonic() - stopped_at
        assert record["id"] == hung_id, "the replacement of a hung actor takes its id"
        assert "has not beaten" in project.logs(hung_name), "the init says why it ended the role"

        # `docker kill` is a stop through the engine's API: no restart policy restarts it (the
        # engine treats it as the operator's stop). `up` starts it again, under its id.
        killed = project.containers()[name]
        # A start by hand resets the engine's RestartCount: carry what it had counted, plus this one.
        manual_restarts = {name: killed["RestartCount"] + 1}
        project.docker_out("kill", name)
        _wait(f"{name} down after docker kill", lambda: _exited(project, name), RESTART_TIMEOUT, project)
        assert project.containers()[name]["RestartCount"] == killed["RestartCount"], "not restarted"
        kill_wall = time.time()
        project.compose("up", "-d", "--no-build")
        _wait(
            f"{name} started by up",
            lambda: _stepping(project, name, after=kill_wall),
            RESTART_TIMEOUT,
            project,
        )
        timings["docker_kill_back"] = time.monotonic() - t0

        # The supervisor SIGKILLed (as an OOM kill would): its init exits 137, the engine restarts it
        # (`on-failure:3`), and the new one, whose heartbeat starts before anything slow, takes the
        # running roles back within their rejoin grace, with the restart counts its predecessor kept.
        sup = project.service("supervisor")[0]
        sup_name, sup_pid = sup["Name"].lstrip("/"), sup["State"]["Pid"]
        roles_before = {
            n: (c["State"]["Pid"], c["RestartCount"])
            for n, c in project.containers().items()
            if c["Config"]["Labels"]["com.docker.compose.service"] in ("learner", "actor", "evaluator")
        }
        os.kill(_role_pid(sup), signal.SIGKILL)

        def supervisor_back() -> bool:
            c = project.containers()[sup_name]
            return bool(c["State"]["Running"] and c["State"]["Pid"] != sup_pid and c["RestartCount"] >= 1)

        _wait("the supervisor restarted by the engine", supervisor_back, RESTART_TIMEOUT, project)

        def roles_taken_back() -> dict[tuple[str, int], Any] | None:
            try:
                status = json.loads(
                    project.docker_out("exec", sup_name, "zmqrl", "status", f"/runs/{RUN_NAME}", "--json")
                )
            except subprocess.CalledProcessError:  # not answering yet
                return None
            rows = {(p["role"], p["id"]): p for p in status["processes"]}
            up = all(p["state"] in ("running", "waiting", "blocked", "evaluating") for p in rows.values())
            return rows if len(rows) == ACTORS + 2 and up else None

        rows = _wait("the new supervisor to hear every role", roles_taken_back, RESTART_TIMEOUT, project)
        timings["supervisor_back"] = time.monotonic() - t0
        after = project.containers()
        assert {
            n: (after[n]["State"]["Pid"], after[n]["RestartCount"]) for n in roles_before
        } == roles_before, "the roles must outlive their supervisor's restart: none may exit or be restarted"
        engine_now = {
            i: after[n]["RestartCount"] + manual_restarts.get(n, 0) for n, i in ids_by_container.items()
        }
        counted_now = {k[1]: r["restarts"] for k, r in rows.items() if k[0] == "actor"}
        assert counted_now == engine_now, "the restarted supervisor carries the restart counts on"

        # Any peer that reaches the heartbeat port (here: this test, over the host's loopback) used
        # to end the run with one forged `learner-0 finished`; compose ships with the control plane
        # authenticated, so it is counted and dropped, and the learner goes on to its last update
        # (below). So is the same forgery signed with the actor's key, as a subverted actor
        # container would send it: that key speaks only for actors.
        forge_learner_finished(int(project.env["ZMQRL_HEARTBEAT_PORT"]))
        actor_key = project.volume_dir("keys-actor") / "control.key"
        forge_learner_finished(int(project.env["ZMQRL_HEARTBEAT_PORT"]), actor_key=actor_key)

        # The learner finishes; the supervisor broadcasts stop; every role exits 0 and stays down.
        def run_over() -> bool:
            cs = project.containers()
            return all(
                c["State"]["Status"] == "exited"
                for c in cs.values()
                if c["Config"]["Labels"]["com.docker.compose.service"] != "tensorboard"
            )

        _wait("the run to finish and every role to exit", run_over, FINISH_TIMEOUT, project)
        timings["finished"] = time.monotonic() - t0
        cs = project.containers()
        codes = {n: c["State"]["ExitCode"] for n, c in cs.items() if "tensorboard" not in n}
        assert set(codes.values()) == {0}, f"every role must exit 0 after the learner finishes: {codes}"
        tb = project.service("tensorboard")[0]
        assert tb["State"]["Running"] and _health(tb) == "healthy"

        # What flowed, from the run volume.
        run_dir = project.volume_dir() / RUN_NAME
        learner_stats = json.loads((run_dir / "learner-stats.json").read_text())
        assert learner_stats["updates"] >= MAX_UPDATES
        assert learner_stats["samples"] > 0, "samples must reach the learner"
        assert learner_stats["weights_version"] > 0, "the learner must publish weights"
        evaluator_stats = json.loads((run_dir / "evaluator-stats.json").read_text())
        assert evaluator_stats["evaluations"] > 0, "the evaluator must have evaluated"
        assert evaluator_stats["evaluated_version"] > 0, "...weights the learner published"
        summary = json.loads((run_dir / "stats.json").read_text())
        _assert_actors_got_weights(summary)
        # Every restart the engine made (and the start by hand after `docker kill`) is one the
        # watch-only supervisor counted, per actor id: it tells starts apart by their start id.
        engine = {
            ids_by_container[n]: c["RestartCount"] + manual_restarts.get(n, 0)
            for n, c in cs.items()
            if n in ids_by_container
        }
        counted = {row["actor_id"]: row["restarts"] for row in summary["actors"]}
        assert counted == engine, f"supervisor's restarts {counted} != the engine's {engine}"
        assert summary["supervisor"]["unauthenticated_heartbeats"] >= 2, "a forged heartbeat was taken"
        token = project.volume_dir("control-secret") / "control.token"
        assert token.is_file() and (token.stat().st_mode & 0o077) == 0, "the control token, private"
        assert not list(project.volume_dir().rglob("control.token")), "no secret on the run volume"
        # Each container holds its own key and no other; TensorBoard none; only the supervisor the token.
        for name, c in cs.items():
            service = c["Config"]["Labels"]["com.docker.compose.service"]
            mounted = [m["Name"] for m in c["Mounts"] if m["Type"] == "volume"]
            volumes = {v.removeprefix(f"{project.name}_") for v in mounted}
            own = {
                "supervisor": {"control-secret", "keys-learner", "keys-actor", "keys-evaluator"},
                "tensorboard": set(),
            }.get(service, {f"keys-{service}"})
            assert volumes == {"runs", *own}, (name, volumes)
        timings["checked"] = time.monotonic() - t0

        # A second `up` on the finished run, as a new user tries it: the supervisor refuses it and
        # so does every role, each before it writes anything (one line, exit 2); not a file of the
        # finished run changes.
        volume = project.volume_dir()
        files_before = _files_of(volume)
        project.compose("up", "-d", "--no-build")
        roles_then = [n for n in project.containers() if "tensorboard" not in n and n != sup_name]

        def every_role_refused() -> bool:
            # Exit 2 each (the engine's `on-failure` then retries them, with a growing delay, each
            # refused again); the supervisor, `on-failure:3`, has given up.
            cs = project.containers()
            refused = all(
                cs[n]["State"]["ExitCode"] == 2 and "will not write into it" in project.logs(n)
                for n in roles_then
            )
            return refused and _exited(project, sup_name)

        _wait("every role to refuse the finished run", every_role_refused, RESTART_TIMEOUT, project)
        timings["second_up_refused"] = time.monotonic() - t0
        assert project.containers()[sup_name]["State"]["ExitCode"] == 2
        assert "not watching it again" in project.logs(sup_name)
        assert _files_of(volume) == files_before, "a finished run's files changed"

        # Down: nothing of the project is left, not even a process.
        leftovers = project.down()
        timings["down"] = time.monotonic() - t0
        assert leftovers == {"containers": [], "networks": [], "volumes": [], "processes": []}, leftovers
    except BaseException:
        print(project.compose("logs", "--no-color", "--tail", "40", timeout=60, check=False))
        raise
    finally:
        print(f"compose test timings (s from start): { ({k: round(v, 1) for k, v in timings.items()}) }")


def _files_of(root: Path) -> dict[str, tuple[int, int]]:
    """Size and modification time of every file under ``root``."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def forge_learner_finished(heartbeat_port: int, actor_key: Path | None = None) -> None:
    """Send the supervisor `learner-0 finished` from a raw socket: without any key, or signed with
    the actor's key (``actor_key``: the file on the actor's key volume), as a subverted actor would."""
    import shutil
    import tempfile

    import zmq

    from zmqrl.transport import wire
    from zmqrl.transport.control_auth import HEARTBEAT, ControlAuth
    from zmqrl.transport.control_keys import KeySource, role_key_path

    frames = wire.dump(wire.HeartbeatMsg("learner", 0, 1, time.time(), "finished", {}, {}))
    if actor_key is not None:
        with tempfile.TemporaryDirectory() as keys_dir:
            held = role_key_path(Path(keys_dir), "actor")  # where an actor container reads it
            held.parent.mkdir()
            shutil.copy(actor_key, held)
            sealed = ControlAuth(KeySource(None, None, Path(keys_dir), role="actor")).seal(frames, HEARTBEAT)
        assert sealed is not None, f"no actor key in {actor_key}"
        frames = sealed
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 2000)
    push.connect(f"tcp://127.0.0.1:{heartbeat_port}")
    push.send_multipart(frames)
    push.close()
    ctx.term()


def _assert_actors_got_weights(summary: dict[str, Any]) -> None:
    rows = summary.get("actors") or []
    assert len(rows) >= ACTORS, f"the supervisor's summary must list every actor: {summary}"
    for row in rows:
        assert row.get("samples", 0) > 0, f"every actor must send samples: {row}"
        assert row.get("weights_version", 0) > 0, f"every actor must receive weights: {row}"


def test_compose_runs_appo_when_zmqrl_config_names_its_file(appo_project: Project) -> None:
    project = appo_project
    try:
        project.compose("build", "--force-rm", "supervisor", timeout=BUILD_TIMEOUT)
        _name_the_build_cache_and_prune(project)  # the code may have changed since the other test
        project.compose("up", "-d", "--no-build", "--scale", f"actor={ACTORS}")

        def run_over() -> bool:
            cs = project.containers()
            roles = [
                c for c in cs.values() if c["Config"]["Labels"]["com.docker.compose.service"] != "tensorboard"
            ]
            return len(roles) == len(ROLES) - 1 + ACTORS and all(
                c["State"]["Status"] == "exited" for c in roles
            )

        _wait("the APPO run to finish and every role to exit", run_over, FINISH_TIMEOUT, project)
        cs = project.containers()
        codes = {n: c["State"]["ExitCode"] for n, c in cs.items() if "tensorboard" not in n}
        assert set(codes.values()) == {0}, f"every role must exit 0 after the learner finishes: {codes}"
        run_dir = project.volume_dir() / RUN_NAME
        learner_stats = json.loads((run_dir / "learner-stats.json").read_text())
        # The learner held a rollout queue of two batches, not replay: it read the APPO file.
        batch = load_config(ROOT / "configs" / "cartpole_appo.yaml").agent.batch_size
        assert learner_stats["replay_capacity"] == 2 * batch, learner_stats
        assert learner_stats["updates"] >= 60 and learner_stats["bad_messages"] == 0
        assert learner_stats["samples"] >= 60 * batch, "rollouts of a batch per update reached the learner"
        evaluator_stats = json.loads((run_dir / "evaluator-stats.json").read_text())
        assert evaluator_stats["evaluations"] > 0 and evaluator_stats["evaluated_version"] > 0
        _assert_actors_got_weights(json.loads((run_dir / "stats.json").read_text()))
        leftovers = project.down()
        assert leftovers == {"containers": [], "networks": [], "volumes": [], "processes": []}, leftovers
    except BaseException:
        print(project.compose("logs", "--no-color", "--tail", "40", timeout=60, check=False))
        raise
