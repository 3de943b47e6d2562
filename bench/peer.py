"""llama.cpp's server, the engine a CPU user would run instead of vLLM, as the labs' peer.

`make peer` builds `llama-cpp-python[server]` into .venv-peer (requirements/peer.lock; not
part of `make test`) and keeps the Q4_K_M GGUF the 1.5B reader is converted from at
.models/gguf/. The labs start the server here, on a free loopback port, in a process group of
its own that they stop when done, and point the service at it through
`generator.engine: openai` (the pipeline unchanged, llama.cpp generating), with the
reader's own tokenizer for the token budgets.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.service import ROOT, free_port, running_server

PEER_PYTHON = ROOT / ".venv-peer" / "bin" / "python"
PEER_GGUF = ROOT / ".models" / "gguf" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
PEER_MODEL = "qwen2.5-coder-1.5b-instruct"  # the name the service asks the server for
PEER_TOKENIZER = ".models/qwen2.5-coder-1.5b-instruct"  # the GGUF's own vocabulary, converted
CONTEXT_TOKENS = 2048  # generator.max_model_len's default


def server_argv(port: int, threads: int, gguf: Path = PEER_GGUF) -> list[str]:
    """llama-cpp-python's OpenAI server on `gguf`, loopback only, `threads` for prefill and
    decode alike."""
    return [
        str(PEER_PYTHON), "-m", "llama_cpp.server", "--model", str(gguf),
        "--model_alias", PEER_MODEL, "--host", "127.0.0.1", "--port", str(port),
        "--n_ctx", str(CONTEXT_TOKENS), "--n_threads", str(threads),
        "--n_threads_batch", str(threads),
    ]  # fmt: skip


@contextmanager
def llama_server(out_dir: Path, threads: int | None = None) -> Iterator[str]:
    """The peer server on every core this process may use (or `threads`), its log at
    `out_dir/llama.server.log`; yields its base URL up to /v1 and stops it on exit."""
    for needed, how in ((PEER_PYTHON, "make peer"), (PEER_GGUF, "make peer")):
        if not needed.exists():
            raise SystemExit(f"{needed} is missing: run `{how}` first")
    out_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = server_argv(port, threads or len(os.sched_getaffinity(0)))
    with running_server(argv, f"{url}/v1/models", out_dir / "llama.server.log",
                        env=os.environ, name="llama.cpp server", ready_timeout_s=300,
                        poll_s=1.0):  # fmt: skip
        yield f"{url}/v1"


def peer_generator(base_url: str) -> dict[str, object]:
    """The overrides that make the service's generator the peer server at `base_url`."""
    return {
        "generator.engine": "openai",
        "generator.openai": {"base_url": base_url, "model": PEER_MODEL,
                             "tokenizer": PEER_TOKENIZER},
    }  # fmt: skip
