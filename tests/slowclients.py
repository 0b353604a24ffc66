"""Clients that hold an HTTP server's connections: each sends a request head a line at a time and, when the
server closes its connection, opens another at once (the worst case for a server that makes room).
Used by the agent's flood test and by bench/agent_flood.py."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from dataclasses import dataclass, field


@dataclass
class SlowClients:
    """`count` slow clients of `host:port`, each sending one header line every `line_seconds`."""

    host: str
    port: int
    count: int = 40
    line_seconds: float = 2.0
    path: str = "/metrics"
    #: connections opened so far, all clients together
    connections_opened: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        for index in range(self.count):
            thread = threading.Thread(target=self._run, name=f"slow-client-{index}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=self.line_seconds + 5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                connection = socket.create_connection((self.host, self.port), timeout=5)
            except OSError:
                self._stop.wait(0.05)
                continue
            with self._lock:
                self.connections_opened += 1
            with contextlib.closing(connection):
                self._hold(connection)

    def _hold(self, connection: socket.socket) -> None:
        """Send the head a line at a time until the server closes the connection (or the clients stop)."""
        try:
            connection.sendall(f"GET {self.path} HTTP/1.1\r\nHost: {self.host}\r\n".encode())
            line = 0
            while not self._stop.is_set():
                next_line = time.monotonic() + self.line_seconds
                while (left := next_line - time.monotonic()) > 0 and not self._stop.is_set():
                    readable, _, _ = select.select([connection], [], [], min(left, 0.5))
                    if readable and not connection.recv(65536):
                        return  # closed by the server
                connection.sendall(f"X-Slow-{line}: {'y' * 16}\r\n".encode())
                line += 1
        except OSError:
            return
