#!/usr/bin/env bash
# What a bigger machine changes, in one prepared script of at most 9 minutes (a GPU machine with
# 16 cores): two steps, one after the other.
#
#  1. `zmqrl bench` into OUT.json: scaling (CartPole DQN with 1, 2, 4, 8, 14 uncapped actors,
#     transitions/s and updates/s with their CPU cost; ingest from 32 senders; the Nature CNN's and
#     the MinAtar CNN's learner updates/s on the device), fanin (1, 8, 64, 256 simulated actors at
#     one total rate against a real learner and supervisor: what binds as actors are added), mlp
#     (the CartPole MLP learner's updates/s on the device beside one CPU core) and captured (each
#     agent's update replayed as a CUDA graph against eager, side by side, agent.capture).
#  2. An APPO run on Pong (configs/pong_appo.yaml) with 14 actors and the learner on the device,
#     for the time left of the budget (learner.max_seconds), through `zmqrl launch`; its
#     metrics.jsonl (the curve: `zmqrl plot`), stats.json, learner-stats.json, summary and console
#     output are copied to OUT-appo/ beside the JSON, for docs/results/.
#
#   benchmarks/device_check.sh [OUT.json]           # default device_check.json, --device cuda
#   ZMQRL_DEVICE_CHECK_QUICK=1 benchmarks/device_check.sh out.json   # small and short, on this CPU
#
# Quick mode (ZMQRL_DEVICE_CHECK_QUICK=1) runs every step small on the CPU: `zmqrl bench --quick`
# with 1 actor, and the APPO step on MinAtar Breakout (configs/minatar_breakout_appo.yaml, 1 actor,
# 3 s of training, no evaluator) instead of Pong, whose first greedy episode alone takes longer on
# a CPU than the whole quick run should.
#
# Settings (environment):
#   ZMQRL_DEVICE_CHECK_QUICK=1       the small run above
#   ZMQRL_DEVICE_CHECK_SECONDS       the budget of the whole script (default 540; quick: 300)
#   ZMQRL_DEVICE_CHECK_DEVICE        the learner's device (default cuda; quick: cpu)
#   ZMQRL_DEVICE_CHECK_ACTORS        the scaling part's actor counts (default 1,2,4,8,14; quick: 1)
#   ZMQRL_DEVICE_CHECK_PARTS         bench parts (default scaling,fanin,mlp,captured; quick:
#                                    scaling,fanin,mlp; "none" skips step 1 and leaves the APPO
#                                    run all the budget)
#   ZMQRL_DEVICE_CHECK_APPO_CONFIG   the APPO run's config (default configs/pong_appo.yaml; quick:
#                                    configs/minatar_breakout_appo.yaml)
#   ZMQRL_DEVICE_CHECK_APPO_ACTORS   its actors (default 14; quick: 1)
#   ZMQRL_DEVICE_CHECK_APPO_SECONDS  its learner.max_seconds (default: what the budget leaves after
#                                    step 1 less APPO_MARGIN; quick: 3); 0 skips step 2
#   ZMQRL_DEVICE_CHECK_WHEELS        a wheelhouse to install first (default: .whl/ in the repo)
#   ZMQRL                            the command (default: zmqrl if on PATH, else python3 -m zmqrl)
#   PYTHON                           the interpreter (default python3)
#
# A device the machine lacks ends step 1 at once with exit 2 and one line. Exit status: the first
# step that failed (the bench's: 1 when a part crashed), else 0.
#
# What the GPU machine lacks, carried as a wheelhouse (no network there). Its image has Python
# 3.12, torch with CUDA, numpy, msgpack, PyYAML, typer, rich, tensorboard, prometheus-client,
# cloudpickle, typing-extensions and opencv-python-headless; zmqrl needs besides them, as
# cp312 manylinux x86_64 wheels in one directory (.whl/ in the repo root, or
# ZMQRL_DEVICE_CHECK_WHEELS), about 10 MB in all:
#   pyzmq (>= 26.4)            the sockets
#   gymnasium (>= 1.0)         the envs, and its one missing dependency: farama-notifications
#   ale-py (>= 0.9)            Atari Pong (the ROMs ship in the wheel)
#   minatar (>= 1.0.15)        optional: the MinAtar rows use the game's known spaces without it
# Made on a machine with network access, e.g.:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl pyzmq gymnasium farama-notifications ale-py
# The script installs every wheel there with `pip install --no-index --find-links DIR --no-deps
# --target DIR` into a directory of its own (nothing of the image changes) and puts it, and the
# repo, on PYTHONPATH; then builds the sum tree's C extension in place if it is missing (else the
# numpy sum tree runs, slower: the learner's log says which).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-device_check.json}"
appo_out="${out%.json}-appo"
python="${PYTHON:-python3}"
started=$SECONDS
# Seconds of an APPO run beyond learner.max_seconds (start-up, the final evaluation, the stop), and
# the least training time worth a run.
APPO_MARGIN=60
APPO_MIN_SECONDS=30

if [[ "${ZMQRL_DEVICE_CHECK_QUICK:-0}" == 1 ]]; then
    quick=(--quick)
    budget="${ZMQRL_DEVICE_CHECK_SECONDS:-300}"
    device="${ZMQRL_DEVICE_CHECK_DEVICE:-cpu}"
    actors="${ZMQRL_DEVICE_CHECK_ACTORS:-1}"
    parts="${ZMQRL_DEVICE_CHECK_PARTS:-scaling,fanin,mlp}"
    appo_config="${ZMQRL_DEVICE_CHECK_APPO_CONFIG:-$repo/configs/minatar_breakout_appo.yaml}"
    appo_actors="${ZMQRL_DEVICE_CHECK_APPO_ACTORS:-1}"
    appo_seconds="${ZMQRL_DEVICE_CHECK_APPO_SECONDS:-3}"
    appo_extra=(--set evaluator.enabled=false --set learner.eval_episodes=1)
    APPO_MIN_SECONDS=1
else
    quick=()
    budget="${ZMQRL_DEVICE_CHECK_SECONDS:-540}"
    device="${ZMQRL_DEVICE_CHECK_DEVICE:-cuda}"
    actors="${ZMQRL_DEVICE_CHECK_ACTORS:-1,2,4,8,14}"
    parts="${ZMQRL_DEVICE_CHECK_PARTS:-scaling,fanin,mlp,captured}"
    appo_config="${ZMQRL_DEVICE_CHECK_APPO_CONFIG:-$repo/configs/pong_appo.yaml}"
    appo_actors="${ZMQRL_DEVICE_CHECK_APPO_ACTORS:-14}"
    appo_seconds="${ZMQRL_DEVICE_CHECK_APPO_SECONDS:-}"
    appo_extra=()
fi

# ---- what the machine lacks -----------------------------------------------------------------------
wheels="${ZMQRL_DEVICE_CHECK_WHEELS:-$repo/.whl}"
if compgen -G "$wheels/*.whl" >/dev/null; then
    site="${TMPDIR:-/tmp}/zmqrl-device-check-site"
    echo "device_check: installing the wheels in $wheels into $site"
    "$python" -m pip install -q --no-index --find-links "$wheels" --no-deps --no-compile \
        --disable-pip-version-check --upgrade --target "$site" "$wheels"/*.whl
    export PYTHONPATH="$site:$repo:$repo/benchmarks${PYTHONPATH:+:$PYTHONPATH}"
fi
if [[ -n "${ZMQRL:-}" ]]; then
    read -r -a zmqrl <<<"$ZMQRL"
elif command -v zmqrl >/dev/null; then
    zmqrl=(zmqrl)
else
    # zmqrl from the repo, and zmqrl_bench (`zmqrl bench`) from its benchmarks/ as an install has it.
    export PYTHONPATH="$repo:$repo/benchmarks${PYTHONPATH:+:$PYTHONPATH}"
    zmqrl=("$python" -m zmqrl)
fi
if ! (cd "$repo" && "$python" -c "import zmqrl.replay._sumtree" 2>/dev/null); then
    echo "device_check: building the sum tree's C extension in place (the numpy one runs if this fails)"
    (cd "$repo" && "$python" setup.py -q build_ext --inplace >/dev/null 2>&1) || true
fi

status=0

# ---- step 1: the bench ------------------------------------------------------------------------------
if [[ "$parts" != none ]]; then
    "${zmqrl[@]}" bench "${quick[@]}" --only "$parts" --actors "$actors" --device "$device" --json "$out" ||
        status=$?
    if [[ "$status" == 2 ]]; then
        exit 2  # a setting to fix (a device this machine lacks): nothing else would mean anything
    fi
fi

# ---- step 2: APPO with the learner on the device, for the time left -------------------------------
if [[ -z "$appo_seconds" ]]; then
    appo_seconds=$((budget - (SECONDS - started) - APPO_MARGIN))
fi
if ((appo_seconds < APPO_MIN_SECONDS)); then
    echo "device_check: APPO run skipped (${appo_seconds} s of training left in the ${budget} s budget)"
    exit "$status"
fi
runs="$(mktemp -d "${TMPDIR:-/tmp}/zmqrl-device-check-XXXXXX")"
trap 'rm -rf "$runs"' EXIT
name="$(basename "${appo_config%.yaml}")"
echo "device_check: $name with $appo_actors actors, learner on $device, ${appo_seconds} s of training"
mkdir -p "$appo_out"
appo_status=0
"${zmqrl[@]}" launch "$appo_config" --plain \
    --set "run.dir=$runs" --set "run.name=$name" \
    --set "actor.num_actors=$appo_actors" --set "agent.device=$device" \
    --set "learner.max_seconds=$appo_seconds" \
    --set transport.samples=tcp://127.0.0.1:0 --set transport.weights=tcp://127.0.0.1:0 \
    --set transport.heartbeat=tcp://127.0.0.1:0 --set transport.control=tcp://127.0.0.1:0 \
    --set supervisor.metrics_http=null "${appo_extra[@]}" 2>&1 | tee "$appo_out/launch.log" ||
    appo_status=$?
for file in metrics.jsonl stats.json learner-stats.json summary.txt; do
    if [[ -f "$runs/$name/$file" ]]; then
        cp "$runs/$name/$file" "$appo_out/$file"
    fi
done
echo "device_check: the APPO run's curve and stats are in $appo_out/ ($((SECONDS - started)) s in all)"
if ((status == 0)); then
    status=$appo_status
fi
exit "$status"
