"""The data channels, under the names the rest of zmqrl imports them by.

Each channel lives in a module of its own: the samples channel (actor -> learner) in
:mod:`zmqrl.transport.sample_channel`, the weights channel (learner -> actors) in
:mod:`zmqrl.transport.weights_channel`, the tally every receiver counts its drops in in
:mod:`zmqrl.transport.bad_messages`, and the frame-by-frame receive that bounds each message in
:mod:`zmqrl.transport.receiving`. The liveness and stop channels are :mod:`zmqrl.transport.control`.

Receivers never raise on bad input: a malformed, oversized or foreign message is counted in a
``BadMessages`` tally, logged (rate-limited) and dropped, so nothing a peer sends can crash a
process or reach the replay buffer.
"""

from __future__ import annotations

from zmqrl.transport.bad_messages import BAD_MESSAGE_LOG_SECONDS, BadMessages, Clock
from zmqrl.transport.receiving import FrameLimit, MessageTooLarge, recv_bounded
from zmqrl.transport.sample_channel import (
    SAMPLES_MAX_FRAMES,
    SEND_POLL_MS,
    ZERO_COPY_MIN_OBS_BYTES,
    LearnerUnreachable,
    SampleReceiver,
    SampleSender,
)
from zmqrl.transport.weights_channel import (
    JOIN_RESEND_SECONDS,
    JOINS_PER_CALL,
    WEIGHTS_MAX_FRAMES,
    WeightsPublisher,
    WeightsSubscriber,
)

__all__ = [
    "BAD_MESSAGE_LOG_SECONDS",
    "JOINS_PER_CALL",
    "JOIN_RESEND_SECONDS",
    "SAMPLES_MAX_FRAMES",
    "SEND_POLL_MS",
    "WEIGHTS_MAX_FRAMES",
    "ZERO_COPY_MIN_OBS_BYTES",
    "BadMessages",
    "Clock",
    "FrameLimit",
    "LearnerUnreachable",
    "MessageTooLarge",
    "SampleReceiver",
    "SampleSender",
    "WeightsPublisher",
    "WeightsSubscriber",
    "recv_bounded",
]
