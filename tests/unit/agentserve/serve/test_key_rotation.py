"""Rotating a tenant's key or limits updates only the ingress (its Serve user_config):
the application args, and so every model deployment, stay identical, so Ray Serve
restarts no model replica; the running ingress picks up the new key in place."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("ray.serve")

from agentserve.serve.app import Ingress, build_app, build_app_from_args
from agentserve.serve.backend import LocalBackend
from agentserve.serve.ingress import create_app
from agentserve.spec import DeploymentSpec, SpecError, hash_api_key
from agentserve.tenant_config import app_args, ingress_user_config, tenants_from_user_config
from agentserve_bench.fake_engine import FakeEngine
from fastapi.testclient import TestClient
from ray.serve._private.deploy_utils import get_app_code_version
from ray.serve.schema import ServeApplicationSchema

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def _spec(key="sk-old-key-0123", limits=None, host="0.0.0.0"):
    tenant = {"name": "alpha", "api_key_sha256": hash_api_key(key), "sla": {}}
    return DeploymentSpec.model_validate(
        {
            "models": [{"name": "m", "engine": "fake", "max_model_len": 64}],
            "server": {"host": host},
            "tenants": [{**tenant, "rate_limit": limits or {}}],
        }
    )


def _serve_app(spec):
    """The serveConfigV2 application the operator writes (manifests.serve_config)."""
    return {
        "name": "agentserve",
        "route_prefix": "/",
        "import_path": "agentserve.serve.app:build_app_from_args",
        "args": app_args(spec),
        "deployments": [{"name": "ingress", "user_config": ingress_user_config(spec)}],
    }


@pytest.mark.parametrize(
    "change", [{"key": "sk-new-key-4567"}, {"limits": {"tokens_per_minute": 9}}]
)
def test_a_key_or_quota_change_keeps_the_serve_code_version(change):
    before, after = _serve_app(_spec()), _serve_app(_spec(**change))
    assert before["args"] == after["args"]
    assert before["deployments"] != after["deployments"]  # only the ingress's user_config
    # Ray's own rule: a changed code version restarts every deployment of the app
    versions = [get_app_code_version(ServeApplicationSchema(**a)) for a in (before, after)]
    assert versions[0] == versions[1]


def _deployments(app):
    """name -> (init args, options as proto bytes) of every deployment in `app`."""
    ingress = app._bound_deployment
    out = {"ingress": (ingress.init_args[0], ingress._deployment_config.user_config)}
    for model_app in ingress.init_args[1].values():
        d = model_app._bound_deployment
        out[d.name] = (d.init_args[:1], d._deployment_config.to_proto_bytes())
    return out


@pytest.mark.parametrize("build", ["spec", "args"])
def test_building_twice_with_different_keys_gives_identical_model_deployments(build):
    def make(key):
        spec = _spec(key)
        return build_app(spec) if build == "spec" else build_app_from_args(app_args(spec))

    old, new = _deployments(make("sk-old-key-0123")), _deployments(make("sk-new-key-4567"))
    models = [name for name in old if name != "ingress"]
    assert models == ["model-m"]
    assert all(old[n] == new[n] for n in models)
    assert old["ingress"][0] == new["ingress"][0]  # the ingress's init args too
    assert old["ingress"][0].tenants == []  # the keys are in its user_config only


def _client(app):
    return TestClient(app, raise_server_exceptions=False, client=("127.0.0.1", 5000))


def _post(client, key):
    headers = {"Authorization": f"Bearer {key}"}
    return client.post("/v1/chat/completions", json=BODY, headers=headers).status_code


def test_the_running_ingress_takes_the_new_key():
    engine = FakeEngine("m", 64)
    asyncio.run(engine.start())
    old = _spec("sk-old-key-0123")
    app = create_app(
        old.model_copy(update={"tenants": []}),
        {"m": LocalBackend(engine)},
        tenants=tenants_from_user_config(ingress_user_config(old)),
    )
    client = _client(app)
    assert (_post(client, "sk-old-key-0123"), _post(client, "sk-new-key-4567")) == (200, 401)
    new = tenants_from_user_config(ingress_user_config(_spec("sk-new-key-4567")))
    app.state.ingress.set_tenants(new)
    assert (_post(client, "sk-old-key-0123"), _post(client, "sk-new-key-4567")) == (401, 200)


@pytest.mark.filterwarnings("ignore:coroutine .*__del__")
def test_ingress_deployment_reconfigure_before_and_after_its_app_is_built():
    spec = _spec().model_copy(update={"tenants": []})
    ingress = object.__new__(Ingress)  # Serve's wrapper __init__ is async: call ours
    Ingress.__mro__[1].__init__(ingress, spec, {}, tenants_apart=True)
    app = ingress.__serve_build_asgi_app__()
    client = _client(app)
    assert client.get("/v1/models").status_code == 401  # no tenants yet: never open mode
    ingress.reconfigure(ingress_user_config(_spec("sk-new-key-4567")))
    headers = {"Authorization": "Bearer sk-new-key-4567"}
    assert client.get("/v1/models", headers=headers).status_code == 200
    with pytest.raises(SpecError, match="duplicate"):
        twice = ingress_user_config(_spec())["tenants"] * 2
        ingress.reconfigure({"tenants": twice})
    assert client.get("/v1/models", headers=headers).status_code == 200  # kept the old


def test_args_with_tenants_apart_still_need_a_valid_spec():
    args = app_args(_spec())
    args["spec"]["tenants"] = ingress_user_config(_spec())["tenants"]
    with pytest.raises(SpecError, match="user_config"):
        build_app_from_args(args)
