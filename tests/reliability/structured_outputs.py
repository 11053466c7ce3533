"""Structured-output constraints as an attack (issue 64 items 2 and 9): one tenant sends
the a grammar, regex, choice list, JSON Schema (as an object and as JSON text) and
structural tag a 4 MiB body holds, in a loop, and a few constraints just within the
limits (accepted: they are checked on the tenant's own turns), while another tenant
streams. Every oversized one gets its 400 (api/limits.py), the within-limit ones 200,
the streams all complete, and their median TPOT stays within 1.2x of the rounds without
the attack (interleave.py).

Where the cost was: a 3 MiB grammar would compile in xgrammar on the replica's cores;
a 3 MB JSON Schema would be decoded, sized (json.dumps) and meta-validated in the
ingress's process. The body is now decoded, sized and refused in the schema child
process (api/body_check.py), so the ingress's event loop never holds the document.
"""

from __future__ import annotations

import json
import sys

from tests.reliability.hostile_lists import (
    KEY_HOSTILE,
    MODEL,
    hostile_outcome,
    post_attack,
    run_interleaved,
    two_tenant_spec,
)
from tests.reliability.scenario import Outcome, scenario

__all__ = ["EXPECTED", "STRUCTURED_BODIES", "attack", "structured_outputs_grammar"]

_MSG = [{"role": "user", "content": "give me json"}]
_WIDE = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(60_000)}}
_NOTE = {"type": "integer", "description": "n" * 800}  # 100 of them: a body past 64 KiB
_WITHIN = {"type": "object", "properties": {f"p{i}": _NOTE for i in range(100)}}


def _body(**fields: object) -> bytes:
    return json.dumps({"model": MODEL, "messages": _MSG, "max_tokens": 8, **fields}).encode()


def _tag(size: int) -> dict:
    structure = {"begin": "<f>", "schema": {"type": "object"}, "end": "</f>"}
    return {"type": "structural_tag", "structures": [structure] * size, "triggers": ["<f>"]}


STRUCTURED_BODIES: dict[str, bytes] = {  # each under the 4 MiB body limit
    "grammar_2mib": _body(structured_outputs={"grammar": "root ::= " + '"a" ' * 600_000}),
    "regex_1mib": _body(structured_outputs={"regex": "(ab|cd)*" * 130_000}),
    "choice_200k": _body(structured_outputs={"choice": [f"c{i}" for i in range(200_000)]}),
    "json_schema_object_2mb": _body(structured_outputs={"json": _WIDE}),
    "json_schema_text_2mb": _body(structured_outputs={"json": json.dumps(_WIDE)}),
    "structural_tag_3mb": _body(response_format=_tag(50_000)),
    "grammar_within_limit": _body(structured_outputs={"grammar": 'root ::= "a"' + " " * 20_000}),
    "json_schema_within_limit": _body(structured_outputs={"json": _WITHIN}),
}
EXPECTED = {name: "200" if name.endswith("within_limit") else "400" for name in STRUCTURED_BODIES}


def attack(url: str, folder: str) -> dict[str, dict[str, int]]:
    """This scenario's hostile client: STRUCTURED_BODIES."""
    return post_attack(url, folder, KEY_HOSTILE, STRUCTURED_BODIES)


@scenario("input_structured_outputs")
def structured_outputs_grammar(rounds: int = 5, per_round: int = 4) -> Outcome:
    """A tenant sends a 2.4 MB grammar, a 1 MiB regex, 200k choices, a 2 MB JSON Schema
    (object and text) and a 3 MB structural tag, plus two within the limits, in a loop
    while another streams: 400 for each oversized one, 200 for the others, the streams
    all complete, their median TPOT within 1.2x of the rounds without the attack."""
    quiet, attacked, hostile = run_interleaved(
        two_tenant_spec(), "tests.reliability.structured_outputs", rounds, per_round
    )
    return hostile_outcome(quiet, attacked, hostile, EXPECTED)


if __name__ == "__main__":  # the hostile client: URL SWITCH_FOLDER
    print(json.dumps(attack(sys.argv[1], sys.argv[2])))
