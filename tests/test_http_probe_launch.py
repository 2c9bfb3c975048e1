"""Per-role HTTP health in a real `zmqrl launch` (issue 26 item 2): with
``supervisor.health_http=127.0.0.1:0`` every role serves its probes on a port of its own; once the
run trains, the learner's, an actor's and the evaluator's ``/healthz`` and ``/readyz`` answer 200,
and after the run nothing answers and no process is left. Real processes for seconds."""

from __future__ import annotations

import json
import re
import signal
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import tiny_overrides, wait_until
from tests.test_launch import Launch, assert_nothing_left
from zmqrl.config_checks import parse_http_address

pytestmark = pytest.mark.slow
# The line a role's link logs once its probe server is up (the address, port 0 resolved, is also
# in every heartbeat's info under "health_http"; the status snapshot does not carry info yet).
SERVING = re.compile(r"health probes on http://(\S+) \(/healthz, /readyz\)")


def probe_address(log: Path) -> str | None:
    found = SERVING.search(log.read_text()) if log.is_file() else None
    return found.group(1) if found else None


def wait_for_probe_address(launch: Launch, log: Path) -> str:
    wait_until(lambda: probe_address(log) or not launch.running(), 120, f"a probe server in {log}")
    found = probe_address(log)
    assert found is not None, launch.output
    return found


def answer(address: str, path: str) -> tuple[int, str]:
    """(status, reason) of GET ``path``; (0, why) when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=5) as reply:
            return reply.status, str(json.loads(reply.read())["reason"])
    except urllib.error.HTTPError as exc:
        return exc.code, str(json.loads(exc.read())["reason"])
    except OSError as exc:
        return 0, str(exc)


def refuses(address: str) -> bool:
    try:
        socket.create_connection(parse_http_address(address), timeout=1).close()
    except OSError:
        return True
    return False


def test_every_roles_probes_answer_200_while_training_and_are_gone_after(
    run_root: Path,
) -> None:
    run_dir = run_root / "t"
    launch = Launch(
        tiny_overrides(
            run_root,
            learner__max_updates=1_000_000,
            evaluator__enabled=True,
            supervisor__health_http="127.0.0.1:0",
        )
    )
    addresses: dict[str, str] = {}
    try:
        for name in ("learner-0", "actor-0", "evaluator-0"):
            addresses[name] = wait_for_probe_address(launch, run_dir / "logs" / f"{name}.log")
        # The supervisor serves the same probes (its log is the launch's own output).
        wait_until(
            lambda: SERVING.search(launch.output) or not launch.running(), 60, "the supervisor's probes"
        )
        found = SERVING.search(launch.output)
        assert found is not None, launch.output
        addresses["supervisor"] = found.group(1)
        assert len(set(addresses.values())) == 4, "each process has a port of its own"
        last: dict[str, tuple[int, str]] = {}

        def all_ok() -> bool:
            for name, address in addresses.items():
                for path in ("/healthz", "/readyz"):
                    last[f"{name}{path}"] = answer(address, path)
            learner_training = "updates" in last["learner-0/readyz"][1]  # past "waiting for replay"
            return learner_training and all(status == 200 for status, _ in last.values())

        wait_until(lambda: all_ok() or not launch.running(), 120, "every probe to answer 200")
        assert launch.running() and all_ok(), (last, launch.output)
        print(f"\nprobes: {last}")
        assert "actor-0 ready: holding weights v" in last["actor-0/readyz"][1]
        assert "evaluator-0 ready: holding weights v" in last["evaluator-0/readyz"][1]
    finally:
        launch.proc.send_signal(signal.SIGINT)
        code = launch.finish(60)
    assert code == 130, launch.output
    assert_nothing_left(run_dir)
    for name, address in addresses.items():
        assert refuses(address), f"{name}'s probe port still answers after the run"
