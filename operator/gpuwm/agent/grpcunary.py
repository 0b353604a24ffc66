"""A unary gRPC call over HTTP/2 on a unix socket, on the pure-Python `h2` library.

The agent makes one kind of gRPC call, a few seconds apart: the kubelet's pod-resources `List`.
grpcio would add much of the agent's memory budget and background threads; this speaks the same
wire protocol (HTTP/2, `application/grpc`, length-prefixed protobuf, `grpc-status` trailers) in a
fraction of that, with no background thread: one connection is kept between calls.
"""

from __future__ import annotations

import socket
import time
from urllib.parse import unquote

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

#: status names for messages (https://grpc.github.io/grpc/core/md_doc_statuscodes.html)
STATUS_NAMES = {
    0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND",
    6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION", 10: "ABORTED",
    11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED", 13: "INTERNAL", 14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}
_WINDOW = 16 * 1024 * 1024


class GrpcError(Exception):
    """A failed call: `code` is the gRPC status name (UNAVAILABLE for transport failures)."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details


class UnaryChannel:
    """One HTTP/2 connection kept open between calls (a connect and the HTTP/2 preamble each List
    cost more than the call); a connection the server closed meanwhile is opened again, once per call."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self._sock: socket.socket | None = None
        self._connection: h2.connection.H2Connection | None = None

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock = self._connection = None

    def call(self, method: str, request: bytes, timeout_seconds: float, max_receive_bytes: int) -> bytes:
        """Send `request` (serialised protobuf) to `method` (`/package.Service/Method`); return the reply bytes."""
        deadline = time.monotonic() + timeout_seconds
        for attempt in (1, 2):
            reused = self._sock is not None
            try:
                sock, connection = self._open(timeout_seconds)
                sock.settimeout(timeout_seconds)
                return _exchange(sock, connection, method, request, deadline, max_receive_bytes)
            except _Closed as closed:
                self.close()
                if not (reused and attempt == 1):  # only a kept connection is worth a second try
                    raise GrpcError("UNAVAILABLE", str(closed)) from None
            except TimeoutError:
                self.close()
                raise GrpcError(
                    "DEADLINE_EXCEEDED", f"no answer from {self.socket_path} within {timeout_seconds}s"
                ) from None
            except OSError as error:
                self.close()
                if not (reused and attempt == 1):
                    raise GrpcError("UNAVAILABLE", f"{self.socket_path}: {error}") from None
            except GrpcError:
                self.close()  # the connection's state after a failed call is not worth trusting
                raise
            except h2.exceptions.H2Error as error:
                self.close()
                raise GrpcError("INTERNAL", f"HTTP/2 protocol error from {self.socket_path}: {error}") from None
        raise AssertionError("unreachable")

    def _open(self, timeout_seconds: float) -> tuple[socket.socket, h2.connection.H2Connection]:
        if self._sock is None or self._connection is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(timeout_seconds)
                sock.connect(self.socket_path)
            except OSError:
                sock.close()
                raise
            connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
            connection.initiate_connection()
            # a large window: the kubelet's answer on a big node is megabytes, sent without waiting on us
            connection.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: _WINDOW})
            connection.increment_flow_control_window(_WINDOW)
            self._sock, self._connection = sock, connection
        return self._sock, self._connection


class _Closed(Exception):
    """The server closed the connection (or sent GOAWAY) before the reply ended."""


def _exchange(
    sock: socket.socket, connection: h2.connection.H2Connection, method: str, request: bytes, deadline: float,
    max_receive_bytes: int,
) -> bytes:
    stream_id = connection.get_next_available_stream_id()
    connection.send_headers(stream_id, [
        (":method", "POST"), (":scheme", "http"), (":path", method), (":authority", "localhost"),
        ("content-type", "application/grpc"), ("te", "trailers"), ("grpc-timeout", f"{max(1, int((deadline - time.monotonic()) * 1000))}m"),
    ])
    connection.send_data(stream_id, b"\x00" + len(request).to_bytes(4, "big") + request, end_stream=True)
    sock.sendall(connection.data_to_send())

    body = bytearray()
    metadata: dict[str, str] = {}
    ended = False
    while not ended:
        if time.monotonic() > deadline:
            raise TimeoutError
        chunk = sock.recv(256 * 1024)
        if not chunk:
            raise _Closed("connection closed before the reply ended")
        for event in connection.receive_data(chunk):
            if isinstance(event, h2.events.ConnectionTerminated):
                raise _Closed(f"connection terminated by the server (HTTP/2 error {event.error_code})")
            if getattr(event, "stream_id", stream_id) != stream_id:
                continue  # a previous call's late frames
            if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                metadata.update({str(k): str(v) for k, v in event.headers or []})
            elif isinstance(event, h2.events.DataReceived):
                body += event.data or b""
                if len(body) > max_receive_bytes + 5:
                    raise GrpcError("RESOURCE_EXHAUSTED", f"reply larger than {max_receive_bytes} bytes")
                connection.acknowledge_received_data(event.flow_controlled_length or 0, event.stream_id or stream_id)
            elif isinstance(event, h2.events.StreamReset):
                raise GrpcError("UNAVAILABLE", f"stream reset by the server (HTTP/2 error {event.error_code})")
            if isinstance(event, h2.events.StreamEnded):
                ended = True
        outgoing = connection.data_to_send()
        if outgoing:
            sock.sendall(outgoing)

    if metadata.get(":status", "200") != "200":
        raise GrpcError("UNKNOWN", f"HTTP status {metadata[':status']}")
    status = int(metadata.get("grpc-status", "2"))
    if status != 0:
        name = STATUS_NAMES.get(status, str(status))
        raise GrpcError(name, unquote(metadata.get("grpc-message", "")) or "no message")
    if len(body) < 5:
        raise GrpcError("INTERNAL", "reply without a message")
    if body[0] != 0:
        raise GrpcError("UNIMPLEMENTED", "compressed replies are not supported (no grpc-encoding was offered)")
    length = int.from_bytes(body[1:5], "big")
    if length > max_receive_bytes:
        raise GrpcError("RESOURCE_EXHAUSTED", f"reply of {length} bytes exceeds {max_receive_bytes}")
    return bytes(body[5 : 5 + length])
