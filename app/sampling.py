"""OpenAI's sampling and output fields, checked and mapped to the pipeline's `Sampling`.

One place for both the chat and the Responses API: what a field means here, which fields
are refused (with why), and the 400s for values that parse but make no sense (a schema that
is not JSON Schema, a logit bias on a word instead of a token id, top_logprobs without
logprobs).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.errors import ApiError, bad_request
from app.schemas import (
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_STOP_SEQUENCES,
    ChatCompletionRequest,
    JsonObjectFormat,
    JsonSchemaFormat,
    ResponseFormat,
)
from pipeline.messages import OutputFormat, Sampling

# Chat fields a RAG answer cannot honour, and why (the 400's message).
REFUSED_CHAT_FIELDS = {
    "functions": "function calling is not offered: the service answers from its documents",
    "function_call": "function calling is not offered: the service answers from its documents",
    "audio": "the service answers in text only",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "the service searches its own collections, not the web",
}
TOOLS_REFUSED = (
    "tools are not offered: the service answers from its documents, and its retrieval is "
    "its own tool; call it as a tool from your agent instead"
)


def unsupported(param: str, why: str) -> ApiError:
    return bad_request(
        f"'{param}' is not supported: {why}", param=param, code="unsupported_parameter"
    )


def check_tools(tools: list[Any] | None, tool_choice: Any) -> None:
    """Refuse tool use: a non-empty `tools`, or a `tool_choice` that asks for a tool."""
    if tools:
        raise unsupported("tools", TOOLS_REFUSED)
    if tool_choice is not None and tool_choice not in ("none", "auto"):
        raise unsupported("tool_choice", TOOLS_REFUSED)


def check_refused(body: ChatCompletionRequest) -> None:
    """400 `unsupported_parameter` for the first refused field the request set (read off
    the parsed body: no copy of its messages is made)."""
    check_tools(body.tools, body.tool_choice)
    for name, why in REFUSED_CHAT_FIELDS.items():
        if getattr(body, name) is not None:
            raise unsupported(name, why)
    if body.modalities is not None and set(body.modalities) - {"text"}:
        raise unsupported("modalities", "the service answers in text only")


def stop_sequences(stop: str | list[str] | None, param: str = "stop") -> tuple[str, ...]:
    if stop is None:
        return ()
    sequences = [stop] if isinstance(stop, str) else list(stop)
    if len(sequences) > MAX_STOP_SEQUENCES:
        raise bad_request(f"{param}: at most {MAX_STOP_SEQUENCES} sequences", param=param)
    if any(not sequence for sequence in sequences):
        raise bad_request(f"{param}: a stop sequence must not be empty", param=param)
    return tuple(sequences)


def logit_bias_of(bias: Mapping[str, float] | None) -> tuple[tuple[int, float], ...]:
    """Token ids and biases; the engine refuses ids past its vocabulary."""
    if not bias:
        return ()
    if len(bias) > MAX_LOGIT_BIAS_ENTRIES:
        raise bad_request(
            f"logit_bias: at most {MAX_LOGIT_BIAS_ENTRIES} tokens", param="logit_bias"
        )
    pairs = []
    for token, value in bias.items():
        if not token.isdigit():
            raise bad_request(
                f"logit_bias: keys are token ids, not {token[:40]!r}", param="logit_bias"
            )
        if not -100 <= value <= 100:
            raise bad_request(f"logit_bias.{token}: a bias lies in [-100, 100]", param="logit_bias")
        pairs.append((int(token), float(value)))
    return tuple(pairs)


def output_format_of(
    response_format: ResponseFormat | None, param: str = "response_format"
) -> OutputFormat:
    if isinstance(response_format, JsonObjectFormat):
        return OutputFormat("json_object")
    if isinstance(response_format, JsonSchemaFormat):
        return OutputFormat(
            "json_schema", checked_schema(response_format.json_schema.json_schema, param)
        )
    return OutputFormat()


def checked_schema(schema: dict[str, Any], param: str) -> dict[str, Any]:
    """`schema` when it is a JSON Schema (checked against its metaschema), else a 400.
    jsonschema-rs checks in microseconds where the pure-Python jsonschema takes about 3 ms."""
    import jsonschema_rs

    where = f"{param}.schema"
    if not schema:
        raise bad_request(f"{where}: a JSON Schema is required", param=where)
    try:
        jsonschema_rs.meta.validate(schema)
    except jsonschema_rs.ValidationError as exc:
        reason = str(exc).splitlines()[0]
        raise bad_request(f"{where} is not a JSON Schema: {reason}", param=where) from None
    except jsonschema_rs.ReferencingError as exc:
        raise bad_request(f"{where}: {str(exc).splitlines()[0]}", param=where) from None
    return schema


def sampling_of(
    *,
    top_p: float | None = None,
    stop: str | list[str] | None = None,
    seed: int | None = None,
    presence_penalty: float | None = None,
    frequency_penalty: float | None = None,
    logit_bias: Mapping[str, float] | None = None,
    logprobs: bool = False,
    top_logprobs: int | None = None,
    output: OutputFormat | None = None,
) -> Sampling:
    """The pipeline's sampling from OpenAI's fields (checked)."""
    if top_logprobs and not logprobs:
        raise bad_request("top_logprobs needs logprobs: true", param="top_logprobs")
    return Sampling(
        top_p=top_p,
        stop=stop_sequences(stop),
        seed=seed,
        presence_penalty=presence_penalty or 0.0,
        frequency_penalty=frequency_penalty or 0.0,
        logit_bias=logit_bias_of(logit_bias),
        logprobs=logprobs,
        top_logprobs=top_logprobs or 0,
        output=output or OutputFormat(),
    )
