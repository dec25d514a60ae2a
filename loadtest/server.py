"""The server a load test runs against: loopback checks, reachability, the model it serves under a name, and
``mtgate serve`` started for a run."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from loadtest.errors import LoadTestError, log_tail

logger = logging.getLogger(__name__)

LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def check_host(url: str, allow_remote: bool) -> str:
    """Normalise and check a base URL; only loopback hosts unless ``allow_remote``.

    Raises:
        ValueError: not an http(s) URL with a host, or a remote host without ``allow_remote``.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--server {url!r} is not an http:// or https:// URL with a host")
    if parts.hostname not in LOCAL_HOSTS and not allow_remote:
        raise ValueError(f"--server {parts.hostname} is not 127.0.0.1 or localhost; pass --allow-remote to load-test "
                         "a server you operate elsewhere")
    return url.rstrip("/")


def reachable(host: str) -> bool:
    try:
        with urllib.request.urlopen(f"{host}/v2/health/live", timeout=5):
            return True
    except urllib.error.HTTPError:
        return True  # it answered
    except (urllib.error.URLError, OSError):
        return False


def _ready(host: str) -> bool:
    try:
        with urllib.request.urlopen(f"{host}/v2/health/ready", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class LocalServer:
    url: str
    process: subprocess.Popen[bytes]
    log: Path
    timeout_s: float = 120.0  # how long after its start it may take to be ready
    started: float = field(default_factory=time.monotonic)

    def wait_ready(self) -> None:
        """Return once the server reports ready.

        Raises:
            LoadTestError: it exited or was not ready by its deadline (the log's tail is in the message).
        """
        while not _ready(self.url):
            if self.process.poll() is not None:
                raise LoadTestError(f"server exited with code {self.process.returncode}: {log_tail(self.log)}")
            if time.monotonic() > self.started + self.timeout_s:
                raise LoadTestError(f"server not ready after {self.timeout_s:g} s: {log_tail(self.log)}")
            time.sleep(0.2)
        logger.info("server ready at %s (pid %d)", self.url, self.process.pid)


@contextmanager
def start_server(package: Path, log_path: Path, timeout_s: float = 120.0, extra_args: Sequence[str] = (),
                 env: Mapping[str, str] | None = None, wait: bool = True) -> Iterator[LocalServer]:
    """Run ``mtgate serve -m PACKAGE [extra_args]`` on a free 127.0.0.1 port until the block ends (then SIGTERM).

    ``env`` is added to this process's environment for the server (settings such as ``MTGATE_THREADS``). With
    ``wait`` false the block starts at once, before the server is ready: call its ``wait_ready()`` (which has the
    same ``timeout_s``) before sending it anything.

    Raises:
        LoadTestError: the server exited or was not ready within ``timeout_s`` (the log's tail is in the message).
    """
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "serving.commands.main", "serve", "-m", str(package), "--host", "127.0.0.1",
               "--port", str(port), *extra_args]
    logger.info("starting server: %s", " ".join(command))
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env={**os.environ, **env} if env else None)
    server = LocalServer(url, process, log_path, timeout_s)
    try:
        if wait:
            server.wait_ready()
        yield server
    finally:
        _stop(process)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def package_model_name(package: Path) -> str | None:
    """The model name in a package's manifest (what the server calls it), or None when unreadable."""
    try:
        name = json.loads((package / "manifest.json").read_text(encoding="utf-8")).get("name")
    except (OSError, ValueError, AttributeError):
        return None
    return name if isinstance(name, str) and name else None


@dataclass(frozen=True)
class ServedModel:
    """The model a load test sends its requests to, as the server reports it (None: not reported)."""

    name: str
    version: str | None = None
    runtime: str | None = None
    precision: str | None = None

    def describe(self) -> str:
        """``opus-mt-en-de version 1 (onnxruntime/int8)``: how every report names the model tested."""
        artifact = "/".join(v for v in (self.runtime, self.precision) if v)
        return " ".join(filter(None, [self.name, self.version and f"version {self.version}",
                                      artifact and f"({artifact})"]))


def _get_json(url: str, api_key: str | None, data: bytes | None = None) -> Any:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    if data is not None:
        headers["Content-Type"] = "application/json"
    with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=30) as resp:
        return json.loads(resp.read())


def served_model(host: str, name: str | None, api_key: str | None = None) -> ServedModel:
    """The model ``name`` (None: the server's default model) as the server at ``host`` reports it: from mtgate's
    ``/v1/models``, else (Triton) from the Open Inference Protocol's repository index and model metadata.

    Raises:
        LoadTestError: the server does not serve that model, or reports no model at all.
    """
    try:
        models = _get_json(f"{host}/v1/models", api_key)["models"]
    except urllib.error.HTTPError as e:
        if e.code != 404:
            raise LoadTestError(f"the server at {host} answered GET /v1/models with HTTP {e.code}") from e
        return _oip_model(host, name, api_key)  # not mtgate: Triton, say
    except (urllib.error.URLError, OSError) as e:
        raise LoadTestError(f"cannot ask the server at {host} which models it serves: {e}") from e
    except (ValueError, KeyError, TypeError):
        return _oip_model(host, name, api_key)
    served = {str(m["name"]): m for m in models}
    if name is None:
        default = [m for m in models if m.get("default")] or models[:1]
        if not default:
            raise LoadTestError(f"the server at {host} serves no model")
        found = default[0]
    elif name in served:
        found = served[name]
    else:
        raise LoadTestError(f"the server at {host} serves no model named {name!r} (it serves: "
                            f"{', '.join(sorted(served)) or 'none'})")
    return ServedModel(str(found["name"]), *(None if found.get(k) is None else str(found[k])
                                             for k in ("version", "runtime", "precision")))


def _oip_model(host: str, name: str | None, api_key: str | None) -> ServedModel:
    if name is None:
        try:
            index = _get_json(f"{host}/v2/repository/index", api_key, data=b"{}")
            ready = [str(m["name"]) for m in index if m.get("state", "READY") == "READY"]
        except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError) as e:
            raise LoadTestError(f"the server at {host} does not say which models it serves (neither /v1/models nor "
                                f"/v2/repository/index answered: {e}); pass --model-name") from e
        if not ready:
            raise LoadTestError(f"the server at {host} reports no ready model")
        name = ready[0]
    try:
        meta = _get_json(f"{host}/v2/models/{quote(name, safe='')}", api_key)
    except urllib.error.HTTPError as e:
        raise LoadTestError(f"the server at {host} serves no model named {name!r} (HTTP {e.code})") from e
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise LoadTestError(f"the server at {host} does not describe model {name!r}: {e}") from e
    versions = meta.get("versions") if isinstance(meta, dict) else None
    return ServedModel(name, str(versions[-1]) if versions else None,
                       str(meta.get("platform")) if isinstance(meta, dict) and meta.get("platform") else None)
