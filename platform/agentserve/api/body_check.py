"""Decode a large request body in SchemaProcess's child (api/schema_check.py) and refuse
the oversized lists and constraints there, so that a body a tenant fills with 500k token
ids never becomes Python objects in the ingress's own process.

json.loads holds the GIL for the whole document (20-90 ms for 4 MiB of small values): on
a worker thread it still stops the event loop every other tenant's streams need. In the
child it costs the ingress only sending the bytes (the pipe writes release the GIL) and,
for a body that passes, unpickling the value: for the hostile bodies (lists of 500k
items) nothing at all, they come back as a 400. Light imports only: the child imports
this module.
"""

from __future__ import annotations

from typing import Any

from agentserve.api.body import decode_json
from agentserve.api.errors import InvalidRequestError
from agentserve.api.limits import check_list_limits, check_schema_bytes, check_structured_limits

__all__ = ["decode_checked", "decoded_or_raise"]

# ("ok", value) or ("error", (message, param, code)): plain data crosses the pipe, not an
# exception object (whose keyword arguments pickle would not carry)
Checked = tuple[str, Any]


def decode_checked(raw: bytes, check_limits: bool) -> Checked:
    """The decoded body, or the 400 it gets: not JSON, or (`check_limits`, for a body the
    engines read as it is: chat and completions, not a Responses body still to translate)
    a list or constraint past api/limits.py's limits, or schemas past MAX_SCHEMA_BYTES."""
    try:
        data = decode_json(raw)
        if check_limits and isinstance(data, dict):
            check_list_limits(data)
            check_structured_limits(data)
            check_schema_bytes(data)  # sized here, not by json.dumps in the ingress
    except InvalidRequestError as err:
        return "error", (err.message, err.param, err.code)
    return "ok", data


def decoded_or_raise(checked: Checked) -> Any:
    """decode_checked's value, or its InvalidRequestError raised here."""
    status, value = checked
    if status == "error":
        message, param, code = value
        raise InvalidRequestError(message, param=param, code=code)
    return value
