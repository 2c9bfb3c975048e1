"""Where a real run's learner and actor spend their time: py-spy on `zmqrl launch`, per role.

Starts ``zmqrl launch CONFIG`` (run directory in a temp dir, run long enough not to end while
sampled), waits until the learner has trained (its first ``losses/`` row in metrics.jsonl), then
samples the learner and actor 0 at once for ``--seconds`` with ``py-spy record --format raw``
(every thread, idle ones included, native frames so that a wait is seen as the system call it
is). For each role it prints the share of wall time each thread spent busy and waiting, and the
top functions by own time: the innermost Python function of each sample, marked ``waiting`` when
the sample's native leaf is a blocking call (poll, futex, sleep, ...). Every process it started
is gone when it returns. Needs py-spy (``pip install py-spy``) and permission to ptrace the run's
processes (root, or kernel.yama.ptrace_scope = 0).

    python benchmarks/profile_run.py                       # CartPole, 15 s
    python benchmarks/profile_run.py --seconds 30 --top 20 --set actor.num_actors=1
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Native calls (below a sample's innermost Python frame) that mean the thread is blocked: in a
# lock or condition, a sleep, a poll or a blocking receive.
IDLE_CALLS = frozenset(
    {
        "PyThread_acquire_lock_timed", "time_sleep", "clock_nanosleep", "nanosleep", "zmq_poll",
        "poll", "__poll", "ppoll", "epoll_wait", "select", "pselect", "zmq_msg_recv", "sem_wait",
        "sem_timedwait", "sem_clockwait", "do_futex_wait", "__futex_abstimed_wait_common", "wait4",
    }
)  # fmt: skip
# A condition wait that is not under a Python lock is CPython taking the GIL back (take_gil
# itself is static in libpython, so it does not show): the thread wants to run and cannot.
GIL_WAITS = frozenset({"pthread_cond_timedwait", "pthread_cond_wait"})
# Python functions that block, for samples taken without native frames.
IDLE_PYTHON = frozenset(
    {"Condition.wait", "Event.wait", "Poller.poll", "Socket.recv", "Socket.recv_multipart", "Queue.get"}
)
KINDS = ("busy", "gil", "idle")
# Seconds to wait for the run to start training, and for it to stop once asked.
START_TIMEOUT_S = 180.0
STOP_GRACE_S = 30.0


@dataclass
class Profile:
    """One process's samples: per thread and per function (own time), counts by kind of time:
    ``busy`` (computing), ``gil`` (waiting for the GIL), ``idle`` (blocked, nothing to do)."""

    role: str
    pid: int
    threads: dict[str, Counter[str]] = field(default_factory=dict)  # label -> {kind: n}
    functions: dict[str, Counter[str]] = field(default_factory=dict)  # function -> {kind: n}
    samples: int = 0

    @property
    def ticks(self) -> int:
        """Samples of one thread over the whole recording (every thread is sampled each tick)."""
        return max((sum(c.values()) for c in self.threads.values()), default=0) or 1


def is_python_frame(frame: str) -> bool:
    return frame.endswith(".py)")


def frame_name(frame: str) -> str:
    return frame.split(" (", 1)[0]


def kind_of(frames: list[str], last_python: int) -> str:
    """busy, gil or idle, from the native frames under the innermost Python frame (or, without
    native frames, from that Python function's name)."""
    native = [frame_name(f) for f in frames[last_python + 1 :] if not f.startswith("0x")]
    if not native:
        return "idle" if last_python >= 0 and frame_name(frames[last_python]) in IDLE_PYTHON else "busy"
    if native[-1] in GIL_WAITS and "PyThread_acquire_lock_timed" not in native:
        return "gil"
    return "idle" if any(n in IDLE_CALLS for n in native) else "busy"


def thread_label(frames: list[str]) -> str:
    """``NAME (what it runs)``: the thread's name and its outermost Python function below
    threading's own frames."""
    name = frames[0].split(": ", 1)[-1] if frames[0].startswith("thread (") else "?"
    runs = next(
        (frame_name(f) for f in frames[1:] if is_python_frame(f) and not f.endswith("(threading.py)")), ""
    )
    return f"{name} ({runs})" if runs and name != "MainThread" else name


def parse_raw(text: str, role: str, pid: int) -> Profile:
    """py-spy's raw format: one ``frame;frame;...;leaf COUNT`` line per distinct stack, outermost
    first, the first frame ``thread (TID): NAME`` (with --threads)."""
    prof = Profile(role, pid)
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        python = [i for i, f in enumerate(frames) if i > 0 and is_python_frame(f)]
        last = python[-1] if python else -1
        kind = kind_of(frames, last)
        own = frames[last] if last >= 0 else frames[-1]
        prof.threads.setdefault(thread_label(frames), Counter())[kind] += count
        prof.functions.setdefault(own, Counter())[kind] += count
        prof.samples += count
    return prof


def summary(prof: Profile, top: int) -> str:
    """Threads with their busy / GIL / idle shares, the top functions by own busy time, and the
    top waits."""
    pct = 100.0 / prof.ticks
    lines = [f"== {prof.role} (pid {prof.pid}), as % of the sampled wall time"]
    lines.append(f"   {'thread':<52}  busy  GIL-wait  idle")
    for name, c in sorted(prof.threads.items(), key=lambda kv: -kv[1]["busy"]):
        shares = f"{c['busy'] * pct:5.1f}  {c['gil'] * pct:8.1f}  {c['idle'] * pct:4.1f}"
        lines.append(f"   {name[:52]:<52} {shares}")
    lines.append(f"   top {top} functions by own busy time (innermost Python frame, native calls included):")
    busy = sorted(prof.functions.items(), key=lambda kv: -kv[1]["busy"])[:top]
    lines += [f"   {c['busy'] * pct:6.1f}%  {func}" for func, c in busy if c["busy"]]
    lines.append("   waiting in (GIL-wait: ready but without the GIL; idle: blocked):")
    waits = [(c[k], k, func) for func, c in prof.functions.items() for k in ("gil", "idle") if c[k]]
    lines += [f"   {n * pct:6.1f}%  {func}  [{k}]" for n, k, func in sorted(waits, reverse=True)[: top // 2]]
    return "\n".join(lines)


def children(pid: int) -> dict[int, str]:
    """Processes whose parent is ``pid``: pid -> command line."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                out[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except (OSError, ValueError, IndexError):
            continue
    return out


def find_role(pid: int, role: str) -> int | None:
    """The supervisor's child running ``python -m zmqrl ROLE`` (actor: the one with ``--id 0``)."""
    for child, cmd in children(pid).items():
        words = cmd.split()
        ids = [words[i + 1] for i, word in enumerate(words[:-1]) if word == "--id"]
        if role in words and (role != "actor" or ids == ["0"]):
            return child
    return None


def trained(run_dir: Path) -> bool:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return False
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.get("source") == "learner" and str(row.get("tag", "")).startswith("losses/"):
            return True
    return False


def record(py_spy: str, pid: int, seconds: float, out: Path, native: bool) -> subprocess.Popen[bytes]:
    cmd = [py_spy, "record", "-p", str(pid), "-d", str(int(seconds)), "-f", "raw", "-o", str(out)]
    cmd += ["--idle", "--threads", "--nolineno", *(["--native"] if native else [])]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def sample(py_spy: str, pids: dict[str, int], seconds: float, work: Path) -> dict[str, Path]:
    """Samples every pid at once; a role whose native sampling fails (py-spy cannot always unwind
    native frames) is sampled again without them."""
    outs: dict[str, Path] = {}
    for native in (True, False):
        todo = {role: pid for role, pid in pids.items() if role not in outs}
        if not todo:
            break
        procs = {r: record(py_spy, pid, seconds, work / f"{r}.txt", native) for r, pid in todo.items()}
        for role, proc in procs.items():
            text, _ = proc.communicate(timeout=seconds + 120)
            path = work / f"{role}.txt"
            if proc.returncode == 0 and path.exists():
                outs[role] = path
            else:
                print(f"py-spy on {role} ({'native' if native else 'python only'}) failed: "
                      f"{text.decode(errors='replace').strip()[-400:]}", file=sys.stderr)  # fmt: skip
    return outs


def stop(sup: subprocess.Popen[bytes], known: set[int]) -> None:
    """SIGTERM to the supervisor (it stops its children in order), then SIGKILL to whatever of the
    run is left: the children run in sessions of their own, so each is killed by pid."""
    known |= set(children(sup.pid))
    if sup.poll() is None:
        sup.send_signal(signal.SIGTERM)
        try:
            sup.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            sup.kill()
            sup.wait()
    for pid in known:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default=str(REPO / "configs/cartpole_dqn.yaml"))
    parser.add_argument("--seconds", type=float, default=15.0, help="seconds of sampling")
    parser.add_argument("--top", type=int, default=12, help="functions shown per role")
    parser.add_argument("--set", action="append", default=[], help="a config override, as zmqrl launch takes")
    parser.add_argument("--keep", type=Path, default=None, help="copy the raw py-spy files here")
    args = parser.parse_args()
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(py_spy).exists():
        raise SystemExit("py-spy not found: pip install py-spy")
    with tempfile.TemporaryDirectory(prefix="zmqrl-profile-") as tmp:
        work = Path(tmp)
        run_dir = work / "prof"
        cmd = [sys.executable, "-m", "zmqrl", "launch", args.config, "--name", "prof"]
        cmd += ["--set", f"run.dir={work}"]
        # Long enough that the run is still training while sampled (nothing else changes).
        cmd += ["--set", "learner.max_updates=10000000", "--set", "learner.stop_at_target=false"]
        cmd += [item for s in args.set for item in ("--set", s)]
        with (work / "launch.log").open("wb") as log:
            sup = subprocess.Popen(
                cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        known: set[int] = set()
        try:
            deadline = time.time() + START_TIMEOUT_S
            pids: dict[str, int] = {}
            while time.time() < deadline and sup.poll() is None:
                for role in ("learner", "actor"):
                    found = pids.get(role) or find_role(sup.pid, role)
                    if found:
                        pids[role] = found
                if len(pids) == 2 and trained(run_dir):
                    break
                time.sleep(0.2)
            else:
                tail = (work / "launch.log").read_text()[-2000:]
                raise SystemExit(f"the run did not start training:\n{tail}")
            known |= set(pids.values())
            print(
                f"sampling learner {pids['learner']} and actor 0 {pids['actor']} for {args.seconds:g} s",
                flush=True,
            )
            outs = sample(py_spy, pids, args.seconds, work)
        finally:
            stop(sup, known)
        for role, path in outs.items():
            print()
            print(summary(parse_raw(path.read_text(), role, pids[role]), args.top))
            if args.keep:
                args.keep.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, args.keep / path.name)


if __name__ == "__main__":
    main()
