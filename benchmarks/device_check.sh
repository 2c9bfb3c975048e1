#!/usr/bin/env bash
# What a bigger machine changes, in one JSON file: `zmqrl bench`'s learner part (on its device)
# and its scaling part (uncapped actors 1-16 with their CPU cost per 1,000 env steps and updates,
# ingest from 32 senders, the Nature CNN's and the MinAtar CNN's learner updates/s on the device).
# Under 8 minutes on a GPU machine; nothing but `zmqrl bench` runs.
#
#   benchmarks/device_check.sh [OUT.json]           # default device_check.json, --device cuda
#   ZMQRL_DEVICE_CHECK_QUICK=1 benchmarks/device_check.sh out.json   # small counts, on this CPU
#
# Settings (environment): ZMQRL_DEVICE_CHECK_QUICK=1 (a smoke run of about a minute: --quick,
# 1 actor, CPU), ZMQRL_DEVICE_CHECK_DEVICE (default cuda; quick: cpu), ZMQRL_DEVICE_CHECK_ACTORS
# (default 1,2,4,8,16; quick: 1), ZMQRL_DEVICE_CHECK_PARTS (default learner,scaling; quick:
# scaling), ZMQRL (the command, default zmqrl; e.g. "python -m zmqrl"). A device the machine
# lacks ends it at once with exit 2 and one line; the JSON is written when the bench ends.
set -euo pipefail

out="${1:-device_check.json}"
read -r -a zmqrl <<<"${ZMQRL:-zmqrl}"
if [[ "${ZMQRL_DEVICE_CHECK_QUICK:-0}" == 1 ]]; then
    quick=(--quick)
    device="${ZMQRL_DEVICE_CHECK_DEVICE:-cpu}"
    actors="${ZMQRL_DEVICE_CHECK_ACTORS:-1}"
    parts="${ZMQRL_DEVICE_CHECK_PARTS:-scaling}"
else
    quick=()
    device="${ZMQRL_DEVICE_CHECK_DEVICE:-cuda}"
    actors="${ZMQRL_DEVICE_CHECK_ACTORS:-1,2,4,8,16}"
    parts="${ZMQRL_DEVICE_CHECK_PARTS:-learner,scaling}"
fi

exec "${zmqrl[@]}" bench "${quick[@]}" --only "$parts" --actors "$actors" --device "$device" --json "$out"
