"""Parse risky uploads (PDF, HTML) in a child process with a time and a memory limit.

A crafted file can make a parser loop or blow up in memory (a PDF whose streams inflate to
gigabytes: pypdf stops each stream at 75 MB, but a file may hold many). In the writer's job
thread that would stall every collection's ingestion, and a thread cannot be killed. So each
such file is parsed in a process of its own, killed on a breach, and the file fails with a
clear error while the job goes on with the others. Plain text and JSON are parsed in place:
their parsers are linear in the bytes, which the upload limit already bounds.

The processes come from a small parse server (`python -m corpus.parse_worker`), started
once as a fresh interpreter that has imported the parsers: for each file it forks a child,
caps the child's address space (RLIMIT_AS, Linux), waits for its answer until the deadline,
kills it past that, and answers. The Ray replica itself is never forked, and the children
never re-import the replica's main module (multiprocessing's forkserver would, on every file).
"""

from __future__ import annotations

import os
import pickle
import resource
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

from corpus.uploads import parse_upload, upload_suffix
from retrieval.documents import Document, DocumentError

# The suffixes whose parsers run in a child process.
BOUNDED_SUFFIXES = frozenset({".pdf", ".html", ".htm"})
MIB = 1 << 20
# How much longer than a parse's deadline the server may take to answer before it counts
# as lost (and is started again).
SERVER_GRACE_S = 10.0

Parse = Callable[[str, bytes, str | None], list[Document]]


@dataclass(frozen=True)
class ParseLimits:
    """How long, and how much memory beyond what the parser process starts with, one file's
    parse may take."""

    timeout_s: float = 30.0
    memory_bytes: int = 1024 * MIB


class BoundedParser:
    """`parser(filename, content, content_type)`: parse_upload, in a child process for the
    suffixes in BOUNDED_SUFFIXES. Raises DocumentError, naming the file, for what
    parse_upload refuses and for a parse that broke a limit or died. Thread-safe (one parse
    at a time); `close()` stops the server."""

    def __init__(self, limits: ParseLimits = ParseLimits(), parse: Parse = parse_upload) -> None:
        self.limits = limits
        self._parse = parse
        self._server: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def __call__(self, filename: str, content: bytes, content_type: str | None) -> list[Document]:
        if upload_suffix(filename, content_type) not in BOUNDED_SUFFIXES:
            return parse_upload(filename, content, content_type)
        request = (self._parse, filename, content, content_type, self.limits)
        with self._lock:
            outcome, payload = self._ask(request, filename or "upload")
        if outcome == "documents":
            return payload
        raise DocumentError(payload)

    def close(self) -> None:
        with self._lock:
            self._stop_server()

    def _ask(self, request: tuple, label: str) -> tuple[str, Any]:
        server = self._running_server()
        assert server.stdin is not None and server.stdout is not None
        try:
            _write_frame(server.stdin, request)
            answer = _read_frame(server.stdout, self.limits.timeout_s + SERVER_GRACE_S)
        except (OSError, EOFError, TimeoutError, pickle.PickleError) as exc:
            self._stop_server()
            return "error", (
                f"{label}: the parse server failed ({type(exc).__name__}); the file was skipped"
            )
        return answer

    def _running_server(self) -> subprocess.Popen[bytes]:
        if self._server is None or self._server.poll() is not None:
            environment = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
            self._server = subprocess.Popen(
                [sys.executable, "-m", "corpus.parse_worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                bufsize=0,  # unbuffered: select() on its stdout sees every byte
                env=environment,
                start_new_session=True,  # a Ctrl-C meant for the service is not its to take
            )
        return self._server

    def _stop_server(self) -> None:
        if self._server is not None and self._server.poll() is None:
            self._server.kill()
            self._server.wait()
        self._server = None


# --- framing: a length, then a pickle -------------------------------------------------------


def _write_frame(stream: IO[bytes], value: Any) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(struct.pack("!Q", len(data)) + data)
    while view:  # an unbuffered pipe may take part of it at a time
        view = view[stream.write(view) or 0 :]
    stream.flush()


def _read_frame(stream: IO[bytes], timeout_s: float | None = None) -> Any:
    if timeout_s is not None and not select.select([stream], [], [], timeout_s)[0]:
        raise TimeoutError("no answer in time")
    header = _read_exactly(stream, 8)
    return pickle.loads(_read_exactly(stream, struct.unpack("!Q", header)[0]))


def _read_exactly(stream: IO[bytes], size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = stream.read(left)
        if not chunk:
            raise EOFError("the stream ended")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# --- the server and its children -------------------------------------------------------------


def serve(requests: IO[bytes], answers: IO[bytes]) -> None:
    """Answer parse requests until `requests` ends: one child per request."""
    import pypdf  # noqa: F401  (imported once here, inherited by every child)

    while True:
        try:
            parse, filename, content, content_type, limits = _read_frame(requests)
        except EOFError:
            return
        _write_frame(answers, _parse_in_child(parse, filename, content, content_type, limits))


def _parse_in_child(
    parse: Parse, filename: str, content: bytes, content_type: str | None, limits: ParseLimits
) -> tuple[str, Any]:
    label = filename or "upload"
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read_end)
        os.dup2(2, 1)  # whatever the parser prints must not reach the server's answers
        with os.fdopen(write_end, "wb") as out:
            _write_frame(out, _parse_bounded(parse, filename, content, content_type, limits))
        os._exit(0)
    os.close(write_end)
    deadline = time.monotonic() + limits.timeout_s
    reaped = False
    with os.fdopen(read_end, "rb") as answer:
        try:
            if not select.select([answer], [], [], limits.timeout_s)[0]:
                return "error", (
                    f"{label}: parsing took longer than {limits.timeout_s:g} s and was "
                    "stopped; the file was skipped"
                )
            try:
                return _read_frame(answer, max(0.0, deadline - time.monotonic()) + 1)
            except (EOFError, TimeoutError, pickle.PickleError):
                os.kill(pid, signal.SIGKILL)
                code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
                reaped = True
                return "error", (
                    f"{label}: the parser stopped without an answer (exit code {code}); "
                    "the file was skipped"
                )
        finally:
            if not reaped:
                os.kill(pid, signal.SIGKILL)  # done or not, it has nothing more to say
                os.waitpid(pid, 0)


def _parse_bounded(
    parse: Parse, filename: str, content: bytes, content_type: str | None, limits: ParseLimits
) -> tuple[str, Any]:
    """In the child: cap the address space at what it holds now plus the memory limit,
    parse, and say how it went."""
    label = filename or "upload"
    try:
        if sys.platform == "linux":
            limit = _address_space_bytes() + limits.memory_bytes
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        return "documents", parse(filename, content, content_type)
    except DocumentError as exc:
        return "error", str(exc)
    except MemoryError:
        return "error", (
            f"{label}: parsing needed more than {limits.memory_bytes // MIB} MiB and was "
            "stopped; the file was skipped"
        )
    except Exception as exc:  # a parser bug must fail this file, not the job
        return "error", f"{label}: could not be parsed ({type(exc).__name__})"


def _address_space_bytes() -> int:
    """This process's virtual memory size (VmSize), from /proc/self/status."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmSize in /proc/self/status")


if __name__ == "__main__":
    # Answers go to the parent on the original stdout; a stray print goes to stderr.
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    serve(sys.stdin.buffer, answers)
