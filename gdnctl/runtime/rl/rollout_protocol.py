"""How the rl trainer talks to its rollout server: an authenticated socket, one request and one answer at a time.

The rollout server (`python -m gdnctl.runtime --role rollout`) runs in vLLM's own environment, so the two
sides share nothing but this module (stdlib only) and the run dir. The server listens on a free port and
publishes `{host, port, authkey}` in RUN_DIR/rollout/address.json (mode 0600, written atomically); the trainer
either spawns the server itself (colocated, or a local run) or finds the file the Slurm script's rollout step
wrote. Requests and answers are plain dicts of lists and numbers (multiprocessing.connection pickles them and
checks the authkey first); tensors travel as safetensors files in the run dir.

A dead or hung server must fail the job with a sentence, never hang it: every request has a deadline, and
while waiting the client checks that a server it spawned is still alive.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import time
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import Any

from gdnctl.errors import GdnctlError

ADDRESS_FILE = "address.json"
# How often a waiting client looks at the server process: a crash is reported within this many seconds.
POLL_SECONDS = 1.0


class RolloutError(GdnctlError):
    """The rollout server died, hung, or answered a request with an error."""

    exit_code = 1


def rollout_dir(run_dir: Path) -> Path:
    return run_dir / "rollout"


def listen(run_dir: Path) -> Listener:
    """Bind a free port on this host and publish the address for the trainer; returns the listener."""
    authkey = secrets.token_bytes(32)
    host = socket.gethostname()
    listener = Listener((_bind_address(host), 0), authkey=authkey)
    directory = rollout_dir(run_dir)
    directory.mkdir(parents=True, exist_ok=True)
    payload = json.dumps({"host": host, "port": listener.address[1], "authkey": authkey.hex(), "pid": os.getpid()})
    staging = directory / f".{ADDRESS_FILE}.{os.getpid()}"
    # 0600 from creation: the authkey is what keeps other users on a shared node out of the server.
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(payload)
    staging.replace(directory / ADDRESS_FILE)
    return listener


def _bind_address(host: str) -> str:
    # Listen on every interface when the trainer may be on another node (Slurm rollout step); the authkey guards
    # it. Loopback alone would do for a local run, but the address file cannot tell which case this is.
    try:
        socket.getaddrinfo(host, None)
        return "0.0.0.0"
    except socket.gaierror:
        return "127.0.0.1"


class RolloutClient:
    """The trainer's end: `request(op, timeout=..., **fields)` -> the server's answer dict."""

    def __init__(self, connection: Connection, process: subprocess.Popen | None, log_path: Path | None) -> None:
        self._connection = connection
        self._process = process
        self._log_path = log_path

    @classmethod
    def connect(cls, run_dir: Path, *, timeout: float, process: subprocess.Popen | None = None,
                log_path: Path | None = None) -> RolloutClient:
        """Wait up to `timeout` s for the server's address file, then connect to it."""
        address_file = rollout_dir(run_dir) / ADDRESS_FILE
        deadline = time.monotonic() + timeout
        while True:
            _check_alive(process, "starting", log_path)
            connection = _try_connect(address_file)
            if connection is not None:
                return cls(connection, process, log_path)
            if time.monotonic() > deadline:
                if process is not None:
                    process.kill()
                raise RolloutError(f"the rollout server did not come up within {timeout:g} s (no server listening "
                                   f"at {address_file}); {_see_log(log_path)}or raise rollout.timeout_s if vLLM "
                                   "starts slowly here.")
            time.sleep(POLL_SECONDS / 4)

    def request(self, op: str, *, timeout: float, **fields: Any) -> dict[str, Any]:
        try:
            self._connection.send({"op": op, **fields})
        except OSError:
            _check_alive(self._process, op, self._log_path)
            raise RolloutError(f"the rollout server closed the connection before '{op}'; "
                               f"{_see_log(self._log_path)}") from None
        deadline = time.monotonic() + timeout
        while not self._connection.poll(POLL_SECONDS):
            _check_alive(self._process, op, self._log_path)
            if time.monotonic() > deadline:
                self.kill()
                raise RolloutError(f"the rollout server did not answer '{op}' within {timeout:g} s "
                                   "(rollout.timeout_s), so it was stopped as hung; "
                                   f"{_see_log(self._log_path)}or raise rollout.timeout_s if '{op}' is just slow.")
        try:
            reply = self._connection.recv()
        except (EOFError, OSError):
            _check_alive(self._process, op, self._log_path, wait=5.0)
            raise RolloutError(f"the rollout server closed the connection during '{op}'; "
                               f"{_see_log(self._log_path)}") from None
        if "error" in reply:
            raise RolloutError(f"the rollout server failed '{op}': {reply['error']}")
        return reply

    def close(self, timeout: float = 60.0) -> None:
        """Ask the server to exit; stop it if it does not."""
        try:
            self._connection.send({"op": "shutdown"})
            self._connection.close()
        except OSError:
            pass
        if self._process is not None:
            try:
                self._process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()


def _try_connect(address_file: Path) -> Connection | None:
    """A connection to the server the address file names; None while there is no file or nobody listens
    there yet (a file left by an earlier server that is gone, until the new one replaces it)."""
    try:
        address = json.loads(address_file.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    try:
        return Client(_connect_address(address["host"], address["port"]), authkey=bytes.fromhex(address["authkey"]))
    except ConnectionRefusedError:
        return None


def _connect_address(host: str, port: int) -> tuple[str, int]:
    return ("127.0.0.1" if host == socket.gethostname() else host), port


def _see_log(log_path: Path | None) -> str:
    return f"its log is {log_path}; " if log_path else "see the rollout step's log; "


def _check_alive(process: subprocess.Popen | None, op: str, log_path: Path | None, wait: float = 0.0) -> None:
    if process is None:
        return
    try:
        code = process.wait(wait) if wait else process.poll()
    except subprocess.TimeoutExpired:
        code = None
    if code is not None:
        raise RolloutError(f"the rollout server exited with code {code} during '{op}'; {_see_log(log_path)}"
                           "fix what it reports and start the job again (it resumes from the last checkpoint).")
