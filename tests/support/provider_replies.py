"""Scripted replies of each provider's fake server (``fakellm.py``) that say the same in
each provider's format: a text answer, and a turn that calls the test agent's ``lookup``
read. Model outages (``tests/integration/test_model_outage.py``) and fallback across
providers (``test_fallback.py``) script them."""

from __future__ import annotations

import json

from fakellm import Reply, anthropic_message, gemini_response, openai_completion


def answer(provider: str, text: str, *, input_tokens: int = 10, output_tokens: int = 5) -> Reply:
    """A turn of ``provider`` whose whole content is ``text``."""
    if provider == "openai":
        body = openai_completion(
            content=text, prompt_tokens=input_tokens, completion_tokens=output_tokens
        )
        return Reply(body=body)
    if provider == "gemini":
        body = gemini_response(
            [{"text": text}], prompt_tokens=input_tokens, output_tokens=output_tokens
        )
        return Reply(body=body)
    block = {"type": "text", "text": text}
    return Reply(
        body=anthropic_message([block], input_tokens=input_tokens, output_tokens=output_tokens)
    )


def lookup(provider: str, call_id: str) -> Reply:
    """A turn of ``provider`` that calls the test agent's ``lookup`` read (Gemini's call
    has no id, as the Gemini API's calls mostly have none: ``call_id`` is its query)."""
    if provider == "openai":
        call = {
            "id": call_id,
            "type": "function",
            "function": {"name": "lookup", "arguments": json.dumps({"query": call_id})},
        }
        return Reply(body=openai_completion(tool_calls=[call]))
    if provider == "gemini":
        asked = {"functionCall": {"name": "lookup", "args": {"query": call_id}}}
        return Reply(body=gemini_response([asked]))
    block = {"type": "tool_use", "id": call_id, "name": "lookup", "input": {"query": call_id}}
    return Reply(body=anthropic_message([block]))
