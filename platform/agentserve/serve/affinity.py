"""Session and prefix affinity: which replica of a model a request should go to (pure).

Agents resend a growing conversation every turn; on the replica that served the previous
turn its prefix is in vLLM's prefix cache, anywhere else it is computed again. So:
1. The ingress gives each request an affinity key (`affinity_key`): the client's
   `x-session-id` if it sent one, else a hash of the conversation's leading prompt (the
   messages up to the first user message, each cut at `prefix_chars`, or a completion
   prompt's first `prefix_chars` characters), which every later turn repeats. Keys are
   per tenant and model (tenants' prefix caches are salted apart: api/cache_salt.py). It
   travels as the engine request's AFFINITY_HEADER.
2. The model deployment's request router (serve/affinity_router.py, Ray Serve's request
   router API) remembers where each key went last (`KeyHomes`) and sends the key's next
   request there while `route` says the home holds it: its queue at most `max_imbalance`
   requests longer than the shortest. A key's first request, and one whose home is
   overloaded or gone, routes as Ray Serve's default (power of two choices); the key's home
   then moves to wherever it went. (`route` also ranks the other replicas by load, ties
   broken by a hash of key and replica, for the router's fallback rank.)
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from agentserve.api.ask import Ask
    from agentserve.spec import DeploymentSpec

__all__ = [
    "AFFINITY_HEADER",
    "KeyHomes",
    "Route",
    "affinity_key",
    "affinity_prefix_chars",
    "leading_prompt",
    "route",
]

AFFINITY_HEADER = "x-agentserve-affinity"
SESSION_HEADER = "x-session-id"
MAX_LEADING_MESSAGES = 8  # messages before the first user message that make a chat key

Reason = Literal["home", "new", "gone", "overloaded"]


def affinity_prefix_chars(spec: DeploymentSpec) -> dict[str, int]:
    """Model -> its routing.affinity_prefix_chars, for the models whose requests carry an
    affinity key: affinity on and more than one replica possible (serve/app.py gives the
    same models the affinity router)."""
    return {
        m.name: m.routing.affinity_prefix_chars
        for m in spec.models
        if m.routing.affinity and m.replicas.max_replicas > 1
    }


def leading_prompt(ask: Ask, prefix_chars: int) -> str | None:
    """The part of a request's prompt that every later turn of its conversation repeats;
    None when the request (api/ask.py) has none. Chat: the messages up to and including
    the first user message (roles and contents, each content cut at `prefix_chars`, so
    that conversations sharing a long system prompt still differ by their first user
    message; at most MAX_LEADING_MESSAGES of them). Completion: the first `prefix_chars`
    characters of the prompt's text (or token ids), the first prompt of a batch."""
    if ask.kind == "chat":
        parts = []
        for message in ask.messages[:MAX_LEADING_MESSAGES]:
            role, content = _role_content(message)
            parts.append(f"{role}\x1f{_text(content)[:prefix_chars]}\x1e")
            if role == "user":
                break
        return "".join(parts) or None
    return _text(ask.first_prompt)[:prefix_chars] or None  # a batch: its first prompt


def affinity_key(
    tenant: str,
    model: str,
    headers: Mapping[str, str],
    ask: Ask,
    prefix_chars: int,
) -> str | None:
    """The request's affinity key (module docstring, step 1): 32 hex digits, or None when
    it has neither a session id nor a prompt."""
    session = {k.lower(): v for k, v in headers.items()}.get(SESSION_HEADER, "").strip()
    if session:
        source = f"s\x00{session}"
    else:
        prompt = leading_prompt(ask, prefix_chars)
        if prompt is None:
            return None
        source = f"p\x00{prompt}"
    material = f"{tenant}\x00{model}\x00{source}".encode("utf-8", "surrogatepass")
    return hashlib.sha256(material).hexdigest()[:32]


@dataclass(frozen=True)
class Route:
    """Replica ids in the order to try them (the first is the choice), and why the first."""

    order: tuple[str, ...]
    reason: Reason


def route(key: str, home: str | None, loads: Mapping[str, int | None], max_imbalance: int) -> Route:
    """Rank the replicas `loads` names (id -> queued + running requests; None = unknown,
    counted as 0) for a request with affinity `key` whose last replica was `home`
    (module docstring, step 2). Empty `loads`: an empty order."""
    known = {replica: load or 0 for replica, load in loads.items()}
    if not known:
        return Route((), "new")
    least = min(known.values())
    by_load = sorted(known, key=lambda r: (known[r], -_score(key, r)))
    if home is not None and home in known and known[home] <= least + max_imbalance:
        chosen, reason = home, "home"
    else:
        chosen = by_load[0]
        reason = "new" if home is None else "gone" if home not in known else "overloaded"
    return Route((chosen, *(r for r in by_load if r != chosen)), reason)


class KeyHomes:
    """Affinity key -> the replica that served it last, the `capacity` most recent keys
    (least recently routed dropped first)."""

    def __init__(self, capacity: int = 100_000):
        self.capacity = capacity
        self._homes: OrderedDict[str, str] = OrderedDict()

    def get(self, key: str) -> str | None:
        return self._homes.get(key)

    def set(self, key: str, replica: str) -> None:
        self._homes[key] = replica
        self._homes.move_to_end(key)
        while len(self._homes) > self.capacity:
            self._homes.popitem(last=False)

    def forget_replica(self, replica: str) -> int:
        """Drop the keys whose home is `replica` (it died); how many were dropped."""
        gone = [key for key, home in self._homes.items() if home == replica]
        for key in gone:
            del self._homes[key]
        return len(gone)

    def __len__(self) -> int:
        return len(self._homes)


def _score(key: str, replica: str) -> int:
    """Rendezvous-hash weight of `replica` for `key`."""
    digest = hashlib.blake2b(f"{key}\x00{replica}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def _role_content(message: Any) -> tuple[str, Any]:
    if isinstance(message, Mapping):
        return str(message.get("role", "")), message.get("content")
    return str(getattr(message, "role", "")), getattr(message, "content", None)


def _text(content: Any) -> str:
    """A message content or prompt as text: strings as they are, the rest as JSON."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return json.dumps(content, sort_keys=True, separators=(",", ":"), default=str)
