"""The sbatch script ``zmqrl slurm`` writes: :class:`SlurmJob` (what is settled when it is written)
and :func:`render_script` (pure: the same job, the same text), so its content is tested without
Slurm. The script itself says, step by step, what the job does and why.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

# With --port-base 0, the job picks its ports from its id, so two jobs sharing a node rarely
# collide: base = PORT_RANGE_START + (job id % PORT_SLOTS) * PORT_STRIDE, below the ephemeral range.
PORT_RANGE_START, PORT_SLOTS, PORT_STRIDE = 10_000, 2_200, 10
# Ports used from the base on: samples, weights, heartbeat, control, Prometheus /metrics.
PORTS_PER_JOB = 5
# Seconds before the time limit at which Slurm signals the batch shell, which then stops the run
# cleanly (the learner writes its final checkpoint) instead of being killed at the limit.
STOP_BEFORE_LIMIT_S = 120
# Seconds the script gives the supervisor and the actors to leave once the learner has ended, on
# top of supervisor.stop_grace; then it sends SIGTERM, and the same again before SIGKILL.
LEAVE_MARGIN_S = 10
# What no #SBATCH value may hold: bash reads the header as comments and sbatch reads it line by
# line, so a line break would end the comment and make the rest a line of script (other control
# characters are refused with it).
HEADER_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# What a value this module quotes may not hold either: sbatch unescapes a backslash and ends a
# quote at ", which not every Slurm version did alike, so such a value is refused, not escaped.
HEADER_UNQUOTABLE = re.compile(r'["\\]')
# What sbatch splits a value at, or cuts it at (an unquoted # starts a comment), unless the value
# is in double quotes (sbatch reads a double-quoted value as one: tried with slurm-wlm 22.05).
HEADER_NEEDS_QUOTES = re.compile(r"[\s#']")


def header_problem(value: str, as_given: bool = False) -> str | None:
    """Why ``value`` cannot go on an #SBATCH line, or None. ``as_given``: an option the user wrote
    in sbatch's own syntax (--sbatch), put there unquoted, so only control characters matter."""
    found = HEADER_CONTROL.search(value) or (None if as_given else HEADER_UNQUOTABLE.search(value))
    if found is None:
        return None
    return f"it holds {found.group()!r}, which an #SBATCH line cannot hold"


def header_value(value: str, what: str, as_given: bool = False) -> str:
    """``value`` as an #SBATCH line holds it (double-quoted where sbatch would split it, unless
    ``as_given``); raises ValueError naming ``what`` and the value when no #SBATCH line can hold it."""
    problem = header_problem(value, as_given)
    if problem is not None:
        raise ValueError(f"{what} {value!r}: {problem}")
    return f'"{value}"' if not as_given and HEADER_NEEDS_QUOTES.search(value) else value


@dataclass
class SlurmJob:
    """Everything the script needs, settled when it is written (the allocation is not)."""

    config: Path  # the YAML config, absolute
    run_root: Path  # run.dir, absolute: every role gets it, so no role depends on its working directory
    run_dir: Path  # run.dir/run.name: where the run writes (its keys/ and logs/ too)
    workdir: Path  # the job's working directory (#SBATCH --chdir): where `zmqrl slurm` ran
    python: str  # the interpreter with zmqrl installed, on every node (a shared file system)
    nodes: int = 1
    actors_per_node: int = 1
    cpus_per_actor: int = 1
    time: str | None = None  # #SBATCH --time (None: the partition's default)
    partition: str | None = None
    job_name: str = "zmqrl"
    port_base: int = 0  # 0: from the job id (PORT_RANGE_START ...)
    interface: str | None = None  # the first node's interface whose IPv4 address is used (None: its name's)
    insecure: bool = False  # no keys: plaintext data channels, a token for the control plane
    evaluator: bool = False  # run `zmqrl evaluator` beside the learner
    stop_grace: float = 10.0  # supervisor.stop_grace
    metrics_port: bool = True  # put supervisor.metrics_http on 127.0.0.1:<base + 4>
    overrides: list[str] = field(default_factory=list)  # the user's --set, passed to every role
    sbatch: list[str] = field(default_factory=list)  # extra #SBATCH options, as given

    @property
    def leave_seconds(self) -> int:
        return int(self.stop_grace) + LEAVE_MARGIN_S


def render_script(job: SlurmJob) -> str:
    """The sbatch script for ``job``: its #SBATCH header, then :data:`SCRIPT_BODY` with the job's
    values in place, each quoted for bash (a --set value, a path, is passed on exactly).

    Raises ValueError, naming the value, when one that goes on an #SBATCH line cannot be put there
    safely (:func:`header_problem`): `zmqrl slurm` refuses those first, with what to do instead."""
    header = [
        f"#SBATCH --job-name={header_value(job.job_name, 'the job name')}",
        f"#SBATCH --nodes={job.nodes}",
        f"#SBATCH --ntasks-per-node={job.actors_per_node}",
        f"#SBATCH --cpus-per-task={job.cpus_per_actor}",
        f"#SBATCH --chdir={header_value(str(job.workdir), 'the working directory')}",
        f"#SBATCH --signal=B:TERM@{STOP_BEFORE_LIMIT_S}",
        *([f"#SBATCH --time={header_value(job.time, '--time')}"] if job.time else []),
        *([f"#SBATCH --partition={header_value(job.partition, '--partition')}"] if job.partition else []),
        *(f"#SBATCH {header_value(option, '--sbatch', as_given=True)}" for option in job.sbatch),
    ]
    q = shlex.quote
    if job.interface:
        address = f"$(ip -4 -o addr show dev {q(job.interface)} | awk 'NR == 1 {{ print $4 }}' | cut -d/ -f1)"
    else:
        address = "$(getent ahostsv4 \"$HEAD\" | awk 'NR == 1 { print $1 }')"
    if job.port_base:
        port_base = f"${{ZMQRL_PORT_BASE:-{job.port_base}}}"
    else:
        port_base = (
            f"${{ZMQRL_PORT_BASE:-$(({PORT_RANGE_START} + SLURM_JOB_ID % {PORT_SLOTS} * {PORT_STRIDE}))}}"
        )
    values = {
        "HEADER": "\n".join(header),
        "PYTHON": q(job.python),
        "CONFIG": q(str(job.config)),
        "RUN_ROOT": q(str(job.run_root)),
        "RUN_DIR": q(str(job.run_dir)),
        "USER_SETS": " ".join(f"--set {q(item)}" for item in job.overrides),
        "ACTORS_PER_NODE": str(job.actors_per_node),
        "CPUS_PER_ACTOR": str(job.cpus_per_actor),
        "LEAVE_SECONDS": str(job.leave_seconds),
        "STOP_BEFORE": str(STOP_BEFORE_LIMIT_S),
        "ADDRESS": address,
        "PORT_BASE": port_base,
        "SECURITY": INSECURE_BLOCK if job.insecure else KEYS_BLOCK,
        "METRICS": METRICS_LINE if job.metrics_port else "",
        "EVALUATOR_START": EVALUATOR_START if job.evaluator else "",
        "EVALUATOR_END": EVALUATOR_END if job.evaluator else "",
    }
    return re.sub(r"<<([A-Z_]+)>>", lambda m: values[m.group(1)], SCRIPT_BODY)


# With keys (the default): made once in the run directory, which every node reads.
KEYS_BLOCK = """\
# CurveZMQ keys in the run directory (a shared file system every node reads): made on the first
# start, reused when the job is submitted again. Only this user can read the secrets (mode 0600).
KEYS=$RUN_DIR/keys
if [ ! -f "$KEYS/server.key" ]; then
  "$PYTHON" -m zmqrl keys "$KEYS" > /dev/null || exit 1
fi
SETS+=(--set "transport.keys_dir=$KEYS")
SUPERVISOR_SETS=()"""
# --insecure: plaintext data channels; the supervisor writes the control token and a key per role
# derived from it, and each role reads its own key, never the token.
INSECURE_BLOCK = """\
# --insecure: plaintext data channels on the cluster network; heartbeats and control messages are
# still authenticated: the supervisor writes the run's token and a key per role derived from it in
# the run directory, and each role signs with its own key (so none can speak as another).
SETS+=(--set transport.insecure=true --set "transport.control_keys_dir=$RUN_DIR/control-keys")
SUPERVISOR_SETS=(--set "transport.control_token_file=$RUN_DIR/control.token")"""
METRICS_LINE = """
# Prometheus /metrics of the supervisor, on this node's loopback (an ssh tunnel reaches it).
SETS+=(--set "supervisor.metrics_http=127.0.0.1:$((PORT_BASE + 4))")"""
EVALUATOR_START = """
"$PYTHON" -m zmqrl evaluator "$CONFIG" --resume "${SETS[@]}" > "$RUN_DIR/logs/evaluator-0.log" 2>&1 &
EVALUATOR=$!
PIDS+=("$EVALUATOR")"""
EVALUATOR_END = """
ended_within "$EVALUATOR" "$LEAVE_SECONDS" || end "$EVALUATOR"
wait_for "$EVALUATOR\""""

SCRIPT_BODY = """\
#!/bin/bash
# A zmqrl run on a Slurm allocation, written by `zmqrl slurm` (docs/slurm.md). Submit: sbatch FILE
#
# Slurm runs this script on the allocation's first node. Here it starts the watch-only supervisor
# (its progress lines and summary are this job's output), the learner and, if enabled, the
# evaluator; the actors run as one srun step on the other nodes (on this node too when the
# allocation has only one). Endpoints come from the allocation: this node's address and ports
# from PORT_BASE on. The job ends when the learner does, ends every step it started, and exits
# with the run's code: 0 finished, 1 failed, 2 a setting to fix, 143 stopped (scancel, time limit).
<<HEADER>>

set -u

# Settled when the script was written. At submission, ZMQRL_PYTHON, ZMQRL_ADDRESS and
# ZMQRL_PORT_BASE in the environment win (sbatch passes it on).
PYTHON=${ZMQRL_PYTHON:-<<PYTHON>>}
CONFIG=<<CONFIG>>
RUN_ROOT=<<RUN_ROOT>>
RUN_DIR=<<RUN_DIR>>
USER_SETS=(<<USER_SETS>>)
ACTORS_PER_NODE=<<ACTORS_PER_NODE>>
CPUS_PER_ACTOR=<<CPUS_PER_ACTOR>>
# How long the supervisor and the actors may take to leave once the learner has ended (seconds).
LEAVE_SECONDS=<<LEAVE_SECONDS>>

# The allocation: its first node (this one) hosts the learner; the actors take the others.
: "${SLURM_JOB_NODELIST:?is not set: submit this script with sbatch}"
HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
NODES=$SLURM_JOB_NUM_NODES
# What the learner and the supervisor bind and every role connects to, as seen from this node:
# ZMQRL_ADDRESS as given (several "nodes" on one host may share loopback), else worked out here.
ADDRESS=${ZMQRL_ADDRESS:-<<ADDRESS>>}
if [ -z "$ADDRESS" ]; then
  echo "error: no address for the first node $HEAD: set ZMQRL_ADDRESS (or zmqrl slurm --interface)" >&2
  exit 2
fi
if [ -z "${ZMQRL_ADDRESS:-}" ] && [ "$NODES" -gt 1 ] && [[ $ADDRESS == 127.* ]]; then
  echo "error: $HEAD resolves to $ADDRESS (loopback) on itself, which the other nodes cannot reach:" \\
    "set ZMQRL_ADDRESS to its cluster address (or zmqrl slurm --interface)" >&2
  exit 2
fi
# Five ports from here: samples, weights, heartbeat, control, Prometheus.
PORT_BASE=<<PORT_BASE>>
if [ "$NODES" -gt 1 ]; then
  ACTOR_NODES=$((NODES - 1))
  PLACEMENT=(--exclude="$HEAD")
else
  ACTOR_NODES=1
  PLACEMENT=(--nodelist="$HEAD")
fi
ACTORS=$((ACTOR_NODES * ACTORS_PER_NODE))
mkdir -p "$RUN_DIR/logs" || exit 1

# Every role gets the config, the --set given to `zmqrl slurm`, then this allocation's endpoints.
SETS=("${USER_SETS[@]}"
  --set "run.dir=$RUN_ROOT"
  --set "transport.samples=tcp://$ADDRESS:$PORT_BASE"
  --set "transport.weights=tcp://$ADDRESS:$((PORT_BASE + 1))"
  --set "transport.heartbeat=tcp://$ADDRESS:$((PORT_BASE + 2))"
  --set "transport.control=tcp://$ADDRESS:$((PORT_BASE + 3))"
  --set "actor.num_actors=$ACTORS")<<METRICS>>
<<SECURITY>>

# The exit code of background process $1, also when a trapped signal interrupts the wait.
wait_for() { while kill -0 "$1" 2>/dev/null; do wait "$1"; done; wait "$1"; }
# True when process $1 ends within $2 seconds.
ended_within() {
  local tick
  for ((tick = 0; tick < $2 * 5; tick++)); do
    kill -0 "$1" 2>/dev/null || return 0
    sleep 0.2
  done
  ! kill -0 "$1" 2>/dev/null
}
# Ends process $1: SIGTERM (srun passes it to its tasks), then SIGKILL after LEAVE_SECONDS.
end() { kill -TERM "$1" 2>/dev/null; ended_within "$1" "$LEAVE_SECONDS" || kill -KILL "$1" 2>/dev/null; }

PIDS=()
SUPERVISOR=
STOP_REQUESTED=0
# scancel, or the signal <<STOP_BEFORE>> s before the time limit: the supervisor broadcasts stop
# and every role ends cleanly (the learner after a final checkpoint).
stop_run() {
  STOP_REQUESTED=1
  echo "zmqrl-slurm: stop requested"
  [ -z "$SUPERVISOR" ] || kill -TERM "$SUPERVISOR" 2>/dev/null
}
trap stop_run TERM INT
# However the script ends, nothing it started outlives it (Slurm ends the steps with the job).
trap 'for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done' EXIT

# Roles wait for the supervisor (supervisor.join_timeout) and leave when it is gone.
export ZMQRL_SUPERVISED=1
echo "zmqrl-slurm: job ${SLURM_JOB_ID} on $NODES node(s): learner on $HEAD ($ADDRESS, ports" \\
  "$PORT_BASE-$((PORT_BASE + 4))), $ACTORS actor(s) on $ACTOR_NODES node(s); run dir $RUN_DIR"
"$PYTHON" -m zmqrl supervise "$CONFIG" --plain "${SETS[@]}" "${SUPERVISOR_SETS[@]}" &
SUPERVISOR=$!
PIDS+=("$SUPERVISOR")
# --resume: a resubmitted (or requeued) job continues from the newest checkpoint; the first starts fresh.
"$PYTHON" -m zmqrl learner "$CONFIG" --resume "${SETS[@]}" > "$RUN_DIR/logs/learner-0.log" 2>&1 &
LEARNER=$!
PIDS+=("$LEARNER")<<EVALUATOR_START>>
# One srun task per actor; its rank is its id (its seed and exploration rung), its log actor-RANK.log.
srun --nodes="$ACTOR_NODES" --ntasks="$ACTORS" --ntasks-per-node="$ACTORS_PER_NODE" \\
  --cpus-per-task="$CPUS_PER_ACTOR" "${PLACEMENT[@]}" --kill-on-bad-exit=0 \\
  --output="$RUN_DIR/logs/actor-%t.log" \\
  bash -c 'exec "$@" --id "$SLURM_PROCID"' actor "$PYTHON" -m zmqrl actor "$CONFIG" "${SETS[@]}" &
ACTOR_STEP=$!
PIDS+=("$ACTOR_STEP")

# Until the learner ends, or the supervisor first (a setting it refuses, e.g. a finished run).
while kill -0 "$LEARNER" 2>/dev/null && kill -0 "$SUPERVISOR" 2>/dev/null; do
  sleep 0.5
done
SUPERVISOR_FIRST=0
if kill -0 "$LEARNER" 2>/dev/null; then
  SUPERVISOR_FIRST=1
  wait_for "$SUPERVISOR"
  SUPERVISOR_STATUS=$?
  [ "$STOP_REQUESTED" -eq 1 ] || echo "zmqrl-slurm: supervisor exited $SUPERVISOR_STATUS before the learner"
  # Its stop broadcast (if it sent one) ends the learner after a final checkpoint; else SIGTERM does.
  ended_within "$LEARNER" "$LEAVE_SECONDS" || end "$LEARNER"
  wait_for "$LEARNER"
  LEARNER_STATUS=$?
  echo "zmqrl-slurm: learner exited $LEARNER_STATUS"
else
  wait_for "$LEARNER"
  LEARNER_STATUS=$?
  echo "zmqrl-slurm: learner exited $LEARNER_STATUS"
  # A finished learner has announced it: the supervisor broadcasts stop and exits, and the actors
  # leave. A failed one has not: the supervisor is stopped now, which stops the actors.
  if [ "$LEARNER_STATUS" -ne 0 ] || ! ended_within "$SUPERVISOR" "$LEAVE_SECONDS"; then
    end "$SUPERVISOR"
  fi
  wait_for "$SUPERVISOR"
  SUPERVISOR_STATUS=$?
fi<<EVALUATOR_END>>
ended_within "$ACTOR_STEP" "$LEAVE_SECONDS" || end "$ACTOR_STEP"
wait_for "$ACTOR_STEP"
ACTOR_STATUS=$?
# The run's code: the learner's, or the supervisor's when it refused to run; 143 when the job was
# asked to stop (scancel, the time limit) before the run finished; else the supervisor's verdict.
STATUS=$LEARNER_STATUS
[ "$SUPERVISOR_FIRST" -eq 1 ] && [ "$SUPERVISOR_STATUS" -ne 0 ] && STATUS=$SUPERVISOR_STATUS
[ "$STATUS" -eq 0 ] && [ "$STOP_REQUESTED" -eq 1 ] && STATUS=143
[ "$STATUS" -eq 0 ] && STATUS=$SUPERVISOR_STATUS
echo "zmqrl-slurm: run ended with $STATUS (learner $LEARNER_STATUS, supervisor $SUPERVISOR_STATUS," \
  "actors' step $ACTOR_STATUS)"
exit "$STATUS"
"""
