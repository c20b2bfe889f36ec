"""A raw TCP server on 127.0.0.1 for tests of the client against answers no real server gives on demand: a body that
trickles, a stream that stalls, a port where something that is not HTTP listens, a server that dies mid-chunk."""
from __future__ import annotations

import socket
import threading
from typing import Callable

import pytest


def loopback_server(request: pytest.FixtureRequest, answer: Callable[[socket.socket, threading.Event], None]) -> str:
    """The URL of a listener on a free loopback port. Each connection has its request read and is handed to
    `answer(conn, stop)`, then closed; `stop` is set when the test ends. Every wait is bounded: accept polls the stop
    flag, socket operations time out after 5 s, and the thread is joined with a timeout."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:  # the accept timeout: look at the flag again
                continue
            with conn:
                conn.settimeout(5)
                try:
                    conn.recv(65536)
                    answer(conn, stop)
                except OSError:  # the client went away: its side is what the test judges
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    def close() -> None:
        stop.set()
        thread.join(timeout=5)
        listener.close()

    request.addfinalizer(close)
    return f"http://127.0.0.1:{listener.getsockname()[1]}"


def chunk(piece: bytes) -> bytes:
    """`piece` as one HTTP/1.1 chunk (an empty one ends the body)."""
    return b"%x\r\n%s\r\n" % (len(piece), piece)


STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
