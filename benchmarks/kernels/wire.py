"""Messages between the timer and the candidate's process: JSON over a unix socket pair, with fds."""

from __future__ import annotations

import json
import socket
from typing import Any

MAX_MESSAGE_BYTES = 4 << 20  # a layout of many calls and arguments stays far below this


class ChannelClosed(RuntimeError):
    """The other process closed the channel (it exited, or crashed)."""


def pair() -> tuple[socket.socket, socket.socket]:
    """Two connected ends; a message (``SOCK_SEQPACKET``) arrives whole or not at all."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def send(end: socket.socket, message: dict[str, Any], fds: tuple[int, ...] = ()) -> None:
    """Send one message, passing ``fds`` along (the receiver gets its own copies)."""
    data = json.dumps(message).encode()
    if fds:
        socket.send_fds(end, [data], list(fds))
    else:
        end.sendall(data)


def receive(end: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """The next message and the fds that came with it; ``ChannelClosed`` when the peer is gone."""
    data, fds, _flags, _address = socket.recv_fds(end, MAX_MESSAGE_BYTES, 4)
    if not data:
        for fd in fds:
            socket.close(fd)
        raise ChannelClosed("the other process closed the channel")
    message = json.loads(data)
    if not isinstance(message, dict):
        raise ValueError(f"a message must be a JSON object, got {type(message).__name__}")
    return message, fds
