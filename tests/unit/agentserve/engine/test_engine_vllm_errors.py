"""vLLM's own client errors, raised out of its serving layer, become 4xx, not 500."""

from __future__ import annotations

from agentserve.engine.vllm_errors import request_error_from_vllm
from vllm.exceptions import VLLMNotFoundError, VLLMValidationError


def test_prompt_past_the_context_is_a_400_with_the_openai_code():
    err = VLLMValidationError(
        "This model's maximum context length is 2048 tokens. However, your prompt ...",
        parameter="input_tokens",
        value=4001,
    )
    mapped = request_error_from_vllm(err)
    assert mapped is not None and mapped.status == 400
    assert mapped.code == "context_length_exceeded" and mapped.param is None
    assert "(parameter=" not in mapped.message and "2048 tokens" in mapped.message


def test_other_validation_errors_keep_their_parameter():
    mapped = request_error_from_vllm(VLLMValidationError("bad value", parameter="top_k"))
    assert (mapped.status, mapped.param, mapped.code) == (400, "top_k", None)


def test_not_found_is_404_and_server_faults_stay_unmapped():
    assert request_error_from_vllm(VLLMNotFoundError("no such adapter")).status == 404
    assert request_error_from_vllm(RuntimeError("engine exploded")) is None
    assert request_error_from_vllm(ValueError("internal")) is None


def test_returned_errors_get_openai_types_not_vllm_exception_names():
    """vLLM returns (not raises) rendering errors, a prompt past the context among them,
    with its exception's name as the type: the client sees OpenAI's types either way."""
    from agentserve.engine.vllm_errors import error_from_payload

    def payload(status, type_, message="m"):
        return {"error": {"message": message, "type": type_, "param": None, "code": status}}

    context = error_from_payload(payload(400, "BadRequestError", "maximum context length is 2048"))
    assert (context.status, context.type, context.code) == (
        400, "invalid_request_error", "context_length_exceeded",
    )  # fmt: skip
    assert error_from_payload(payload(422, "UnprocessableEntityError")).type == (
        "invalid_request_error"
    )
    missing = error_from_payload(payload(404, "NotFoundError"))
    assert (missing.status, missing.type) == (404, "not_found_error")
    unsupported = error_from_payload(payload(501, "NotImplementedError"))
    assert (unsupported.status, unsupported.code) == (400, "unsupported_parameter")
    assert type(error_from_payload(payload(500, "InternalServerError"))).__name__ == "EngineError"
