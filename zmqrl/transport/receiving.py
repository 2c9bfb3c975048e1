"""Receiving one message frame by frame, refusing it as soon as it passes its channel's limits.

ZeroMQ's ``MAXMSGSIZE`` limits each *frame*, not a message: 161 frames of 512 KiB passed a 1 MiB
limit, and ``recv_multipart`` then copied all 80 MiB into Python before any check could look at
them. Every zmqrl receiver reads with :func:`recv_bounded` instead: it counts frames and bytes as
it goes, and once a message passes its channel's :class:`FrameLimit` it keeps nothing more of it,
reads the rest of its frames without copying and drops them, and raises :class:`MessageTooLarge`
(a ``WireError``, so the caller counts and logs it like any other bad message). What zmqrl itself
holds of one message is then at most its channel's limit.

What this cannot bound (measured, libzmq 4.3.5; docs/deployment.md "Memory and hostile peers"):
libzmq delivers a multipart message atomically, so it buffers every frame of a message before the
first one is readable, and a socket's high-water mark counts whole messages. A peer that speaks
ZMTP itself can therefore make libzmq hold one message of any number of ``MAXMSGSIZE`` frames per
connection, and never finish it. Only keeping such peers out bounds that: loopback, or CurveZMQ,
whose handshake admits no frame from a client the authenticator refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import zmq

from zmqrl.transport.messages import WireError


class MessageTooLarge(WireError):
    """A message with more frames or bytes than its channel allows; its frames were all dropped."""


@dataclass(frozen=True)
class FrameLimit:
    """The most one message on a channel may hold: frames, and bytes over all its frames."""

    max_frames: int
    max_bytes: int
    setting: str = ""  # the config key that sets max_bytes, named in the drop reason ("" : none)

    def describe(self, frames: int, nbytes: int) -> str:
        where = f" ({self.setting})" if self.setting else ""
        return (
            f"message refused after {frames} frame(s) and {nbytes} byte(s): this channel takes at most "
            f"{self.max_frames} frame(s) and {self.max_bytes} byte(s){where}"
        )


def recv_bounded(sock: zmq.Socket, limit: FrameLimit, *, copy: bool, flags: int = zmq.NOBLOCK) -> list[Any]:
    """One whole message from ``sock`` as bytes (``copy``) or ``zmq.Frame`` objects.

    Raises ``zmq.Again`` when none is queued (with ``NOBLOCK``), and :class:`MessageTooLarge`
    when the message passes ``limit``: by then every frame of it has been read and dropped, so the
    socket stands at the next message. Costs what ``recv_multipart`` costs (the same receive and
    one ``RCVMORE`` query per frame) plus a length sum.
    """
    return recv_rest(sock, limit, [sock.recv(flags, copy=copy)], copy=copy)


def recv_rest(sock: zmq.Socket, limit: FrameLimit, frames: list[Any], *, copy: bool) -> list[Any]:
    """The rest of a message whose first ``frames`` (at least its first) were read already, as
    :func:`recv_bounded` reads it: for a reader that looks at the first frame before it decides
    how to read the others."""
    total = sum(len(f) for f in frames)
    too_large = total > limit.max_bytes
    while sock.getsockopt(zmq.RCVMORE):
        if too_large or len(frames) >= limit.max_frames:
            return _drop_rest(sock, limit, len(frames), total)
        frame = sock.recv(zmq.NOBLOCK, copy=copy)
        frames.append(frame)
        total += len(frame)
        too_large = total > limit.max_bytes
    if too_large:
        raise MessageTooLarge(limit.describe(len(frames), total))
    return frames


def _drop_rest(sock: zmq.Socket, limit: FrameLimit, kept: int, total: int) -> list[Any]:
    """Read the remaining frames of the current message without copying and without keeping any;
    raises MessageTooLarge with the whole message's size. libzmq has the whole message already
    (delivery is atomic), so none of these reads waits."""
    frames = kept
    more = True
    while more:
        frame = sock.recv(zmq.NOBLOCK, copy=False)
        frames += 1
        total += len(frame)
        more = frame.more
        del frame  # its buffer goes back to libzmq now, not when the loop ends
    raise MessageTooLarge(limit.describe(frames, total))
