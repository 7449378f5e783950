"""How the rl trainer talks to its rollout servers: an authenticated socket each, one request and one answer at a
time.

A rollout server (`python -m gdnctl.runtime --role rollout`) runs one vLLM engine in vLLM's own environment, so
the two sides share nothing but this module (stdlib only) and the run dir. The server listens on a free port
(loopback when its trainer rank is on its host, its node's address otherwise) and publishes
`{host, port, authkey}` in RUN_DIR/rollout/address.json (address-K.json for engine K > 0; mode 0600, written
atomically); the trainer either spawns the server itself (colocated, or a local run) or finds the file the
Slurm script's rollout step wrote. Requests and answers are plain dicts of lists and numbers
(multiprocessing.connection pickles them, after the authkey handshake); tensors travel as safetensors files in
the run dir, CUDA IPC handles or a process-group broadcast (weights/cuda_ipc.py, weights/broadcast.py).

A dead or hung server must fail the job with a sentence, never hang it: every request has a deadline, and
while waiting the client checks that a server it spawned is still alive. Whoever else reaches the port must not
end the job either: a peer that fails the handshake, or stalls in it, is logged and dropped, and the server
goes on waiting for the trainer.

The contract an engine fills (OPERATIONS; rollout/server.py serves them on vLLM's asynchronous engine). Requests are
answered in the order they came, one at a time; a sample's generation goes on between and during them.

    start        {model, version}            build the engine on the HF checkpoint dir `model`, serving weight
                                             version `version` (the trainer's steps taken)
    submit       {requests}                  start generating each request, a dict of REQUEST_FIELDS (id, prompt:
                                             token ids, max_tokens, temperature, seed, stop_token_ids, and for an
                                             image prompt `images`: prompts/images.py WireImage each, one image token
                                             in the prompt where each goes, which vLLM expands); answered at
                                             once ({accepted, version}): the samples come by collect
    collect      {wait_s}                    the requests finished since the last collect, waiting up to wait_s for
                                             one: {finished: [{id, tokens, logprobs, versions, finish_reason,
                                             continued}], in_flight, progress: {id: tokens so far} of the running
                                             ones, stalled_s, version}. logprobs: each token's,
                                             after temperature (the distribution sampled); versions: the weight
                                             version that generated each token; continued: how often a weight
                                             update stopped and continued it; stalled_s: how long the engine has had
                                             requests in flight without a new token (0 when idle)
    generate     {prompts, n, max_tokens, temperature, seeds, stop_token_ids, images}
                                             n samples per prompt (images: each prompt's, as a request's, or
                                             None), sample j of prompt i seeded seeds[i][j], answered
                                             once all are done: {samples: [[{id, tokens, logprobs, versions,
                                             finish_reason, continued}] per prompt], seconds, gpu_used_bytes}
    load_weights {path, probe, probe_images, version}
                                             reload every weight from the safetensors in `path` and serve version
                                             `version`; answers with per-parameter checksums (weight_sync), the
                                             log-probs of the probe tokens (with probe_images, an image prompt's, as
                                             a request's images: its image tokens expanded) for the trainer to
                                             compare with its own, and how many requests were continued
    reload_begin                             start an in-memory reload (weights/worker_reload.py); buckets follow
    ipc_bucket   {shared, entries}           load one bucket the trainer ranks shared through CUDA IPC (GPU
                                             UUID -> handle; the bucket's entries as tuples; weights/cuda_ipc.py)
    group_join   {host, port, size, backend, timeout_s, first_rank}
                                             every worker joins trainer rank 0's weight group (weights/broadcast.py)
                                             as first_rank + its rank; answered once the trainer has joined too
    broadcast_bucket {nbytes, entries}       every worker receives one bucket trainer rank 0 broadcasts, and loads
                                             it; answered once every worker has loaded it
    reload_end   {probe, probe_images, version}
                                             finish the reload; answers as load_weights does
    sleep                                    colocated on GPUs: free the weights and the KV cache (vLLM sleep level
                                             2) while the trainer steps; the next reload wakes it
    shutdown                                 exit

A weight update (load_weights, reload_begin) first quiets the engine: requests submitted meanwhile wait for the new
weights, and those in flight finish on the old ones, or with rollout.partial stop, and continue after the update as
requests of their prompt plus their tokens so far, prefilled anew under the new weights (a GDN request never resumes
on state computed under the old ones); their later tokens carry the new version.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import struct
import subprocess
import time
from collections.abc import Callable
from multiprocessing.connection import (
    AuthenticationError,
    Client,
    Connection,
    answer_challenge,
    deliver_challenge,
    wait,
)
from pathlib import Path
from typing import Any

from gdnctl.errors import GdnctlError
from gdnctl.files import replace_text
from gdnctl.runtime.rl.network import LOOPBACK, remote_bind_address

# The operations a rollout server serves (the contract above) and the fields each takes.
OPERATIONS: dict[str, tuple[str, ...]] = {
    "start": ("model", "version"),
    "submit": ("requests",),
    "collect": ("wait_s",),
    "generate": ("prompts", "n", "max_tokens", "temperature", "seeds", "stop_token_ids", "images"),
    "load_weights": ("path", "probe", "probe_images", "version"),
    "reload_begin": (),
    "ipc_bucket": ("shared", "entries"),
    "group_join": ("host", "port", "size", "backend", "timeout_s", "first_rank"),
    "broadcast_bucket": ("nbytes", "entries"),
    "reload_end": ("probe", "probe_images", "version"),
    "sleep": (),
    "shutdown": (),
}
# The fields of one request of `submit`.
REQUEST_FIELDS = ("id", "prompt", "max_tokens", "temperature", "seed", "stop_token_ids")
# A request's field that only an image prompt has (absent: none).
IMAGES_FIELD = "images"

# How often a waiting client looks at the server process: a crash is reported within this many seconds.
POLL_SECONDS = 1.0
# The trainer passes the handshake in milliseconds; the server serves one peer at a time, so a peer that takes
# longer is dropped rather than allowed to keep the trainer waiting behind it.
HANDSHAKE_SECONDS = 10.0
# Who started the rollout server, in the environment of both sides: `external` is the Slurm script's separate
# step (the trainer finds it through the run dir), `local` a server the trainer's rank 0 spawned beside itself.
ROLLOUT_ENV = "GDNCTL_ROLLOUT"
EXTERNAL, LOCAL = "external", "local"


class RolloutError(GdnctlError):
    """The rollout server died, hung, or answered a request with an error."""

    exit_code = 1


def rollout_dir(run_dir: Path) -> Path:
    return run_dir / "rollout"


def engine_file_name(stem: str, engine: int, suffix: str) -> str:
    """A file of one rollout engine: engine 0 keeps the plain name (`address.json`, `rollout.log`: a one-engine
    rollout reads as it always did), engine k adds `-k`."""
    return f"{stem}{suffix}" if engine == 0 else f"{stem}-{engine}{suffix}"


def address_file(run_dir: Path, engine: int = 0) -> Path:
    """Where rollout engine `engine`'s server publishes its address."""
    return rollout_dir(run_dir) / engine_file_name("address", engine, ".json")


def rollout_log(run_dir: Path, engine: int) -> Path:
    """Engine `engine`'s server log: logs/rollout.log for engine 0, logs/rollout-K.log for engine K."""
    return run_dir / "logs" / engine_file_name("rollout", engine, ".log")


def listen(
    run_dir: Path, *, local: bool, engine: int = 0, handshake_seconds: float = HANDSHAKE_SECONDS
) -> RolloutListener:
    """Bind a free port and publish the address (engine `engine`'s address file) for the trainer; returns the
    listener.

    `local`: the trainer's rank 0 runs on this host, so the server listens on loopback only; otherwise on the
    address the trainer reaches this node by (remote_bind_address)."""
    authkey = secrets.token_bytes(32)
    if local:
        host = bind = LOOPBACK
    else:
        host = socket.gethostname()
        bind = remote_bind_address(host)
    listener = RolloutListener(bind, authkey, handshake_seconds)
    path = address_file(run_dir, engine)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = json.dumps({"host": host, "port": listener.address[1], "authkey": authkey.hex(), "pid": os.getpid()})
    # 0600 from creation (mkstemp): the authkey is what keeps other users on a shared node out of the server.
    replace_text(path, payload, mode=0o600)
    return listener


class RolloutListener:
    """The server's end of the socket: `accept()` returns the next connection that passes the authkey handshake."""

    def __init__(self, bind: str, authkey: bytes, handshake_seconds: float) -> None:
        # A queue of several, so that connections arriving behind a stalled one wait instead of being dropped.
        self._socket = socket.create_server((bind, 0), backlog=8)
        self._authkey = authkey
        self._handshake_seconds = handshake_seconds

    @property
    def address(self) -> tuple[str, int]:
        return self._socket.getsockname()[:2]

    def accept(self) -> Connection:
        """Wait for a peer that knows the authkey; every other peer is logged with why, closed, and waited past."""
        while True:
            peer_socket, (peer_host, peer_port) = self._socket.accept()
            try:
                return _handshake(peer_socket, self._authkey, self._handshake_seconds)
            except (AuthenticationError, EOFError, OSError) as error:
                peer_socket.close()
                print(
                    f"gdnctl rollout: dropped a connection from {peer_host}:{peer_port}: "
                    f"{_refusal(error, self._handshake_seconds)}",
                    flush=True,
                )

    def close(self) -> None:
        self._socket.close()

    def __enter__(self) -> RolloutListener:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _NotTheProtocol(OSError):
    """A peer sent a message header that no rollout client sends."""


def _handshake(peer_socket: socket.socket, authkey: bytes, seconds: float) -> Connection:
    """multiprocessing.connection's mutual authkey handshake (what its Listener.accept runs, so the trainer's
    stdlib Client needs nothing new), all of it within `seconds`; the authenticated Connection."""
    channel = _DeadlineChannel(peer_socket, time.monotonic() + seconds)
    deliver_challenge(channel, authkey)
    answer_challenge(channel, authkey)
    # Blocking again: the Connection reads the file descriptor itself, and requests may take minutes.
    peer_socket.settimeout(None)
    return Connection(peer_socket.detach())


class _DeadlineChannel:
    """The two calls the stdlib handshake makes of a Connection, over a socket with one deadline for every read
    and write: a Connection would block for as long as a peer stalls or trickles its bytes."""

    def __init__(self, peer_socket: socket.socket, deadline: float) -> None:
        self._socket = peer_socket
        self._deadline = deadline

    def send_bytes(self, data: bytes) -> None:
        self._arm()
        self._socket.sendall(struct.pack("!i", len(data)) + data)  # multiprocessing.connection's framing

    def recv_bytes(self, maxlength: int) -> bytes:
        (size,) = struct.unpack("!i", self._read(4))
        if not 0 <= size <= maxlength:
            raise _NotTheProtocol(f"a message header announcing {size} bytes")
        return self._read(size)

    def _read(self, count: int) -> bytes:
        data = bytearray()
        while len(data) < count:
            self._arm()
            chunk = self._socket.recv(count - len(data))
            if not chunk:
                raise EOFError
            data += chunk
        return bytes(data)

    def _arm(self) -> None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        self._socket.settimeout(left)


def _refusal(error: BaseException, handshake_seconds: float) -> str:
    """Why a peer was dropped, for the log."""
    if isinstance(error, TimeoutError):
        return f"it did not finish the handshake within {handshake_seconds:g} s"
    if isinstance(error, EOFError):
        return "it disconnected during the handshake"
    if isinstance(error, AuthenticationError):
        return "it answered the authkey challenge wrongly (not the trainer, or a stale address file)"
    if isinstance(error, _NotTheProtocol):
        return f"it sent bytes that are not the rollout protocol ({error})"
    return f"the connection broke during the handshake ({error})"


class RolloutClient:
    """The trainer's end: `request(op, timeout=..., **fields)` -> the server's answer dict."""

    def __init__(
        self, connection: Connection, process: subprocess.Popen | None, log_path: Path | None, engine: int | None = None
    ) -> None:
        """engine: which of several rollout engines this server runs (None: the only one), for the messages."""
        self._connection = connection
        self._process = process
        self._log_path = log_path
        self.engine = engine
        self.who = server_name(engine)
        self._early: dict[str, Any] | None = None  # an answer `check` received before `answer` asked for it

    @classmethod
    def connect(
        cls,
        run_dir: Path,
        *,
        timeout: float,
        engine: int = 0,
        process: subprocess.Popen | None = None,
        log_path: Path | None = None,
        named: bool = False,
    ) -> RolloutClient:
        """Wait up to `timeout` s for engine `engine`'s address file, then connect to its server. named: the
        rollout has several engines, so messages name this one."""
        published = address_file(run_dir, engine)
        who = server_name(engine if named else None)
        deadline = time.monotonic() + timeout
        while True:
            _check_alive(process, "starting", log_path, who=who)
            connected = _try_connect(published)
            if connected is not None:
                connection, host = connected
                client = cls(connection, process, log_path, engine if named else None)
                if host != LOOPBACK:
                    # A server on another node (the Slurm script's rollout step): messages say which node.
                    client.who = f"{client.who} on {host}"
                return client
            if time.monotonic() > deadline:
                if process is not None:
                    process.kill()
                raise RolloutError(
                    f"{who} did not come up within {timeout:g} s (no server listening "
                    f"at {published}); {_see_log(log_path)}or raise rollout.timeout_s if vLLM "
                    "starts slowly here."
                )
            time.sleep(POLL_SECONDS / 4)

    def request(self, op: str, *, timeout: float, **fields: Any) -> dict[str, Any]:
        self.send(op, **fields)
        return self.answer(op, timeout=timeout)

    def send(self, op: str, **fields: Any) -> None:
        """Send a request without waiting for its answer: for collective requests (the broadcast weight sync),
        whose answer comes only once the trainer took part too. `answer` collects it."""
        try:
            self._connection.send({"op": op, **fields})
        except OSError:
            _check_alive(self._process, op, self._log_path, who=self.who)
            raise RolloutError(f"{self.who} closed the connection before '{op}'; {_see_log(self._log_path)}") from None

    def check(self, op: str) -> None:
        """While trainer rank 0 takes part in the collective request `op`: raise if the server died or answered
        it with an error; an answer that came already is kept for `answer`."""
        _check_alive(self._process, op, self._log_path, who=self.who)
        if self._early is None and self._connection.poll(0):
            self._early = self._receive(op)

    def answer(self, op: str, *, timeout: float, setting: str = "rollout.timeout_s") -> dict[str, Any]:
        """The answer to the request `op` sent last, within `timeout` seconds (the preset's `setting`)."""
        if self._early is not None:
            reply, self._early = self._early, None
            return reply
        deadline = time.monotonic() + timeout
        while not self._connection.poll(min(POLL_SECONDS, timeout)):
            _check_alive(self._process, op, self._log_path, who=self.who)
            if time.monotonic() > deadline:
                self.kill()
                raise RolloutError(
                    f"{self.who} did not answer '{op}' within {timeout:g} s "
                    f"({setting}), so it was stopped as hung; "
                    f"{_see_log(self._log_path)}or raise {setting} if '{op}' is just slow."
                )
        return self._receive(op)

    def _receive(self, op: str) -> dict[str, Any]:
        try:
            reply = self._connection.recv()
        except (EOFError, OSError):
            _check_alive(self._process, op, self._log_path, wait=5.0, who=self.who)
            raise RolloutError(f"{self.who} closed the connection during '{op}'; {_see_log(self._log_path)}") from None
        if "error" in reply:
            raise RolloutError(
                f"{self.who} failed '{op}': {reply['error']}{_cause_in_log(self._log_path, reply['error'])}"
            )
        return reply

    def close(self, timeout: float = 60.0) -> None:
        """Ask the server to exit; stop it if it does not."""
        self.shutdown()
        self.wait(timeout)

    def shutdown(self) -> None:
        """Ask the server to exit, without waiting (a server busy with a request exits once it is done)."""
        try:
            self._connection.send({"op": "shutdown"})
            self._connection.close()
        except OSError:
            pass

    def wait(self, timeout: float) -> None:
        """Wait up to `timeout` s for a server this side spawned to exit after `shutdown`; stop it if it does not."""
        if self._process is not None:
            try:
                self._process.wait(max(timeout, 0.0))
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()


def answer_all(
    clients: list[RolloutClient],
    op: str,
    *,
    timeout: float,
    on_answer: Callable[[int, dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Each client's answer to `op`, which was sent to each, in the clients' order, within `timeout` s: a server
    that dies or answers with an error while another is still working is reported then, not once the others are
    done. At the deadline every server still working is stopped as hung, and the sentence names them all.
    `on_answer(index, answer)` is called as each answer arrives, in arrival order (the rewards of one engine's
    samples start while the others still generate)."""
    if len(clients) == 1:
        answers = [clients[0].answer(op, timeout=timeout)]
        if on_answer is not None:
            on_answer(0, answers[0])
        return answers
    deadline = time.monotonic() + timeout
    delivered: set[int] = set()
    while True:
        for index, client in enumerate(clients):
            client.check(op)
            if on_answer is not None and client._early is not None and index not in delivered:
                delivered.add(index)
                on_answer(index, client._early)
        pending = [client for client in clients if client._early is None]
        if not pending:
            return [client.answer(op, timeout=0) for client in clients]
        if time.monotonic() > deadline:
            for client in pending:
                client.kill()
            hung = ", ".join(client.who for client in pending)
            logs = "; ".join(_see_log(client._log_path).removesuffix("; ") for client in pending)
            raise RolloutError(
                f"{hung} did not answer '{op}' within {timeout:g} s (rollout.timeout_s), so "
                f"{'it was' if len(pending) == 1 else 'they were'} stopped as hung ({logs}); raise "
                f"rollout.timeout_s if '{op}' is just slow."
            )
        wait([client._connection for client in pending], timeout=POLL_SECONDS)


def server_name(engine: int | None) -> str:
    """How messages call a rollout server: the only one, or rollout engine K's among several."""
    return "the rollout server" if engine is None else f"rollout engine {engine}'s server"


def _try_connect(path: Path) -> tuple[Connection, str] | None:
    """A connection to the server the address file names, and its host; None while there is no file or nobody
    listens there yet (a file left by an earlier server that is gone, until the new one replaces it)."""
    try:
        address = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    try:
        connection = Client((address["host"], address["port"]), authkey=bytes.fromhex(address["authkey"]))
    except ConnectionRefusedError:
        return None
    return connection, address["host"]


# The rollout server's first line in its log (rollout_server.serve), once it listens.
LISTENING_LINE = "gdnctl rollout: listening on "
# "SomeError: text" anywhere on a line: Python's last traceback line, also behind vLLM's "(EngineCore pid=N)"
# and "ERROR <date> [core.py:N]" prefixes.
_EXCEPTION_LINE = re.compile(r"\b(\w+(?:Error|Exception)): (\S.*)$")
# Read this much of the log's end: the engine's traceback is the last thing it wrote.
_LOG_TAIL_BYTES = 256 << 10


def _cause_in_log(log_path: Path | None, reported: str) -> str:
    """The log's last exception line other than the one the server reported, as a clause to append: vLLM's
    engine core fails its start-up with "Engine core initialization failed. See root cause above.", and the
    root cause is in the engine core process's output, which only the log has."""
    if log_path is None:
        return ""
    try:
        with log_path.open("rb") as log:
            log.seek(max(0, log.seek(0, 2) - _LOG_TAIL_BYTES))
            tail = log.read().decode(errors="replace")
    except OSError:
        return f"; its log is {log_path}"
    for line in reversed(tail.splitlines()):
        if line.startswith(LISTENING_LINE):
            break  # the log is appended to: what came before this server started is an earlier server's
        match = _EXCEPTION_LINE.search(line.strip())
        if match and match.group(2) not in reported:
            return f"; its log {log_path} says: {match.group(0)}"
    return f"; its log is {log_path}"


def _see_log(log_path: Path | None) -> str:
    return f"its log is {log_path}; " if log_path else "see the rollout step's log; "


def exit_description(code: int) -> str:
    """How a server process ended, from its exit code: negative for a signal (Popen's own child), 128 + N for signal
    N (the server group's leader reports the server's end as a shell does: rollout/server_group.py)."""
    signum = -code if code < 0 else code - 128 if code > 128 else 0
    try:
        name = signal.Signals(signum).name if signum else None
    except ValueError:
        name = None
    return f"was killed by {name} (exit code {code})" if name else f"exited with code {code}"


def _check_alive(
    process: subprocess.Popen | None, op: str, log_path: Path | None, wait: float = 0.0, who: str = "the rollout server"
) -> None:
    if process is None:
        return
    try:
        code = process.wait(wait) if wait else process.poll()
    except subprocess.TimeoutExpired:
        code = None
    if code is not None:
        raise RolloutError(
            f"{who} {exit_description(code)} during '{op}'; {_see_log(log_path)}"
            "fix what it reports and start the job again (it resumes from the last checkpoint)."
        )
