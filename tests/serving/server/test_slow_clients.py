"""Slow and idle clients against a real ``mtgate serve``: raw sockets that never finish their request head, never
finish their body, or sit idle, are closed after the configured timeouts while other clients are served, and a
SIGTERM drain does not wait for bodies that never arrive (they get 408)."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.utils.server import ServerProcess, start_server

HEADER_TIMEOUT = 1.0
BODY_TIMEOUT = 1.5
KEEP_ALIVE = 1.0
SLACK = 1.5  # a loaded 2-core machine: how late a close may come


def connect(server: ServerProcess) -> socket.socket:
    host, port = server.address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.settimeout(10)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def read_one_response(sock: socket.socket) -> bytes:
    """One whole response (head and Content-Length body), on a connection that stays open."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(parse_response(data)[1]["content-length"])
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def closed_after(sock: socket.socket, opened: float) -> tuple[float, bytes]:
    data = read_until_closed(sock)
    return time.monotonic() - opened, data


def slow_body_request(sock: socket.socket, path: str = "/v1/translate") -> None:
    """Headers for a 100-byte body, then only 10 bytes of it."""
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n".encode()
        + b'{"text": "'
    )


def parse_response(data: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return status, headers, body


@pytest.fixture(scope="module")
def server(tiny_package: Path) -> Iterator[ServerProcess]:
    env = {
        "MTGATE_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT),
        "MTGATE_BODY_TIMEOUT_S": str(BODY_TIMEOUT),
        "MTGATE_KEEP_ALIVE_TIMEOUT_S": str(KEEP_ALIVE),
    }
    proc = start_server(tiny_package, env=env)
    yield proc
    assert proc.stop() == 0, "".join(proc.log)


def test_slow_and_idle_connections_are_closed_while_others_are_served(server: ServerProcess) -> None:
    results: dict[str, tuple[float, bytes]] = {}

    def idle() -> None:
        opened = time.monotonic()
        sock = connect(server)
        results["idle"] = closed_after(sock, opened)

    def slow_header() -> None:
        opened = time.monotonic()
        sock = connect(server)
        sock.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: test\r\n")
        try:
            for _ in range(20):  # a header byte every 0.2 s, never the blank line that ends the head
                sock.sendall(b"X")
                time.sleep(0.2)
        except OSError:
            pass  # closed under us: what we expect
        results["slow header"] = closed_after(sock, opened)

    def kept_alive() -> None:
        sock = connect(server)
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: test\r\n\r\n")
        first = read_one_response(sock)
        assert first.startswith(b"HTTP/1.1 200"), first
        answered = time.monotonic()
        results["kept alive"] = closed_after(sock, answered)

    def slow_body() -> None:
        sock = connect(server)
        slow_body_request(sock)
        sent = time.monotonic()
        results["slow body"] = closed_after(sock, sent)

    def many_idle() -> None:
        opened = time.monotonic()
        socks = [connect(server) for _ in range(50)]
        waits = [closed_after(s, opened)[0] for s in socks]
        results["50 idle"] = (max(waits), b"")

    threads = [threading.Thread(target=f) for f in (idle, slow_header, kept_alive, slow_body, many_idle)]
    for t in threads:
        t.start()
    # Meanwhile other clients are served, quickly.
    with httpx.Client(base_url=server.url, timeout=10) as client:
        for _ in range(5):
            started = time.monotonic()
            r = client.post("/v1/translate", json={"text": "A man is riding a bicycle.", "beam_size": 1})
            assert r.status_code == 200, r.text
            assert time.monotonic() - started < 2.0
            time.sleep(0.2)
    for t in threads:
        t.join(30)
    assert set(results) == {"idle", "slow header", "kept alive", "slow body", "50 idle"}, results

    for name, timeout in (("idle", HEADER_TIMEOUT), ("slow header", HEADER_TIMEOUT), ("kept alive", KEEP_ALIVE),
                          ("50 idle", HEADER_TIMEOUT)):
        waited, data = results[name]
        assert timeout * 0.8 <= waited <= timeout + SLACK, (name, waited)
        assert data == b"", (name, data)  # closed without an answer: there was no request to answer
    waited, data = results["slow body"]
    assert BODY_TIMEOUT * 0.8 <= waited <= BODY_TIMEOUT + SLACK, waited
    status, headers, body = parse_response(data)
    assert status == 408 and headers["connection"] == "close", data
    error = json.loads(body)["error"]
    assert error["code"] == "request_timeout" and "body_timeout_s" in error["message"], error
    # A slow body on /v2 gets /v2's error body.
    sock = connect(server)
    slow_body_request(sock, "/v2/models/tiny-marian/infer")
    status, _, body = parse_response(read_until_closed(sock))
    assert status == 408 and isinstance(json.loads(body)["error"], str)
    assert httpx.get(server.url + "/v2/health/ready").status_code == 200


def test_a_head_too_large_is_431(server: ServerProcess) -> None:
    sock = connect(server)
    sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: test\r\nX-Big: " + b"a" * (80 << 10))
    data = read_until_closed(sock)
    assert data.startswith(b"HTTP/1.1 431 "), data[:100]


@pytest.mark.parametrize("reads", [1, 2])
def test_a_whole_head_too_large_is_431_in_one_or_two_reads(server: ServerProcess, reads: int) -> None:
    # The head is complete (it ends with its blank line), so the parser finishes it within the read(s).
    head = b"GET /v2/health/live HTTP/1.1\r\nHost: test\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n"
    sock = connect(server)
    if reads == 1:
        sock.sendall(head)
    else:
        sock.sendall(head[:50_000])
        time.sleep(0.3)
        sock.sendall(head[50_000:])
    data = read_until_closed(sock)
    assert data.startswith(b"HTTP/1.1 431 "), data[:100]
    # A head just within the limit (64 KiB) is served, as is a POST with a body after it on one connection.
    sock = connect(server)
    sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: test\r\nX-Big: " + b"a" * 60_000 + b"\r\n\r\n")
    assert parse_response(read_one_response(sock))[0] == 200
    body = json.dumps({"text": "Hi."}).encode()
    sock.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nX-Big: "
                 + b"a" * 60_000 + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    assert parse_response(read_one_response(sock))[0] == 200
    sock.close()


def test_sigterm_drain_does_not_wait_for_bodies_that_never_arrive(tiny_package: Path) -> None:
    # Bodies may take 60 s, the grace period is 20 s: the drain must end long before either.
    proc = start_server(tiny_package, "--grace-period", "20",
                        env={"MTGATE_BODY_TIMEOUT_S": "60", "MTGATE_HEADER_TIMEOUT_S": "60"})
    try:
        socks = [connect(proc) for _ in range(5)]
        for sock in socks:
            slow_body_request(sock)
        time.sleep(0.3)
        inflight = httpx.get(proc.url + "/health").json()["inflight"]
        assert inflight == 0, "a request still sending its body counts as in flight"
        signalled = time.monotonic()
        proc.process.send_signal(signal.SIGTERM)
        for sock in socks:
            status, _, body = parse_response(read_until_closed(sock))
            assert status == 408, body
            assert "shutting down" in json.loads(body)["error"]["message"]
        assert proc.process.wait(10) == 0, "".join(proc.log)
        took = time.monotonic() - signalled
        assert took < 5, f"drain took {took:.1f}s"
    finally:
        proc.stop()


def test_connections_beyond_max_connections_get_503_until_idle_ones_are_closed(tiny_package: Path) -> None:
    proc = start_server(tiny_package, env={"MTGATE_MAX_CONNECTIONS": "4", "MTGATE_HEADER_TIMEOUT_S": "1"})
    try:
        idle = [connect(proc) for _ in range(4)]
        time.sleep(0.2)
        r = httpx.get(proc.url + "/v2/health/live")
        assert r.status_code == 503, r.text  # uvicorn's limit_concurrency
        for sock in idle:
            assert read_until_closed(sock) == b""  # the head deadline frees them
        r = httpx.get(proc.url + "/v2/health/live")
        assert r.status_code == 200 and r.json() == {"live": True}
    finally:
        assert proc.stop() == 0
