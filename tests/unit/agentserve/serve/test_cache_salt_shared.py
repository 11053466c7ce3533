"""The prefix-cache salt key is shared by every ingress replica (api/cache_salt.py): two
ingresses give a tenant the same salt, so its prefixes hit the cache through either, and
a restart keeps it; tenants still never share a salt."""

from __future__ import annotations

import asyncio
import stat

import pytest
from agentserve.api.cache_salt import (
    KEY_ENV,
    KEY_FILE_ENV,
    STATE_DIR_ENV,
    CacheSalter,
    salt_key,
)
from agentserve.serve.backend import LocalBackend
from agentserve.serve.ingress import create_app
from agentserve.spec import DeploymentSpec, hash_api_key
from agentserve_bench.fake_engine import FakeEngine
from asgi_calls import asgi_request

KEYS = {"a": "sk-tenant-a-key", "b": "sk-tenant-b-key"}


def test_local_key_is_created_once_0600_and_kept_across_restarts(tmp_path):
    env = {STATE_DIR_ENV: str(tmp_path / "state")}
    first, second = CacheSalter(salt_key(env)), CacheSalter(salt_key(env))  # two ingresses
    assert first.salt("a") == second.salt("a"), "the same tenant, the same salt"
    assert first.salt("a") != first.salt("b"), "tenants never share a salt"
    (path,) = (tmp_path / "state").iterdir()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    restarted = CacheSalter(salt_key(env))
    assert restarted.salt("a", "s1") == first.salt("a", "s1")
    elsewhere = CacheSalter(salt_key({STATE_DIR_ENV: str(tmp_path / "other")}))
    assert elsewhere.salt("a") != first.salt("a"), "another key, another salt"


def test_operator_key_from_env_or_file_wins_and_must_be_long_enough(tmp_path):
    secret = "k" * 40
    mounted = tmp_path / "key"
    mounted.write_text(secret + "\n")
    from_env = salt_key({KEY_ENV: secret, STATE_DIR_ENV: str(tmp_path / "s")})
    from_file = salt_key({KEY_FILE_ENV: str(mounted), STATE_DIR_ENV: str(tmp_path / "s")})
    assert from_env == from_file == secret.encode()
    assert not (tmp_path / "s").exists(), "no local key when the operator sets one"
    with pytest.raises(ValueError, match="at least"):
        salt_key({KEY_ENV: "short"})


def test_two_ingress_apps_send_the_engine_the_same_salt(tmp_path, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.delenv(KEY_FILE_ENV, raising=False)
    monkeypatch.setenv(STATE_DIR_ENV, str(tmp_path))
    tenants = [{"name": n, "api_key_sha256": hash_api_key(k), "sla": {}} for n, k in KEYS.items()]
    spec = DeploymentSpec.model_validate(
        {"models": [{"name": "m", "engine": "fake", "max_model_len": 256}], "tenants": tenants}
    )
    engine = FakeEngine("m", 256)
    asyncio.run(engine.start())
    ingresses = [create_app(spec, {"m": LocalBackend(engine)}) for _ in range(2)]
    body = {"model": "m", "messages": [{"role": "user", "content": "same prompt"}]}

    def salt_via(app, tenant: str) -> str:
        headers = {"authorization": f"Bearer {KEYS[tenant]}"}
        call = asyncio.run(asgi_request(app, "POST", "/v1/chat/completions", body, headers=headers))
        assert call.status == 200, call.text()
        return engine.requests[-1].body.cache_salt

    a1, a2 = salt_via(ingresses[0], "a"), salt_via(ingresses[1], "a")
    assert a1 == a2, "tenant a's prefixes hit the cache through either ingress"
    assert salt_via(ingresses[1], "b") != a1
