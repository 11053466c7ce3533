"""Issue 15, "The API a client expects": logprobs/top_logprobs (chat), logprobs (completions)
and n > 1, streaming and not, through the official `openai` client (ASGI, fake engine)."""

from __future__ import annotations

import asyncio

import httpx2
import openai
import pytest
from agentserve.serve.backend import LocalBackend
from agentserve.serve.ingress import create_app
from agentserve.spec import DeploymentSpec, hash_api_key
from agentserve_bench.fake_engine import FakeEngine

KEY = "sk-test"
MSG = [{"role": "user", "content": "hi you there"}]
REPLY = "echo: hi you there"


async def _client(
    engine: FakeEngine | None = None, model: dict | None = None, **server
) -> openai.AsyncOpenAI:
    spec = DeploymentSpec.model_validate(
        {
            "models": [{"name": "m", "engine": "fake", "max_model_len": 64, **(model or {})}],
            "tenants": [{"name": "t", "api_key_sha256": hash_api_key(KEY), "sla": {}}],
            "server": server,
        }
    )
    engine = engine or FakeEngine("m", 64)
    await engine.start()
    app = create_app(spec, {"m": LocalBackend(engine)})
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://t")
    return openai.AsyncOpenAI(api_key=KEY, base_url="http://t/v1", http_client=http, max_retries=0)


def _check_chat_logprobs(content, text, top):
    assert "".join(e.token for e in content) == text
    for e in content:
        assert e.logprob <= 0 and e.bytes == list(e.token.encode())
        assert len(e.top_logprobs) == top
        if top:  # the fake's: the token itself first, then alternatives 1 lower each
            assert (e.top_logprobs[0].token, e.top_logprobs[0].logprob) == (e.token, e.logprob)
            assert [t.logprob for t in e.top_logprobs] == [
                round(e.logprob - j, 2) for j in range(top)
            ]


@pytest.mark.parametrize("top", [0, 3])
def test_chat_logprobs_non_stream(top):
    async def run():
        client = await _client()
        r = await client.chat.completions.create(
            model="m", messages=MSG, logprobs=True, top_logprobs=top
        )
        (choice,) = r.choices
        assert choice.message.content == REPLY
        _check_chat_logprobs(choice.logprobs.content, REPLY, top)
        assert len(choice.logprobs.content) == r.usage.completion_tokens == 4
        plain = await client.chat.completions.create(model="m", messages=MSG)
        assert plain.choices[0].logprobs is None  # only when asked for

    asyncio.run(run())


def test_chat_logprobs_stream_ride_with_their_text():
    async def run():
        stream = await (await _client()).chat.completions.create(
            model="m", messages=MSG, logprobs=True, top_logprobs=2, stream=True
        )
        content, text = [], ""
        async for chunk in stream:
            choice = chunk.choices[0]
            piece = choice.delta.content or ""
            mine = choice.logprobs.content if choice.logprobs else []
            assert "".join(e.token for e in mine) == piece  # each chunk's own tokens
            content += mine
            text += piece
        assert text == REPLY
        _check_chat_logprobs(content, REPLY, 2)

    asyncio.run(run())


@pytest.mark.parametrize("stream", [False, True])
def test_completion_logprobs(stream):
    async def run():
        client = await _client()
        kwargs = {"model": "m", "prompt": "a b c", "logprobs": 2}
        if stream:
            chunks = [c async for c in await client.completions.create(**kwargs, stream=True)]
            text = "".join(c.choices[0].text for c in chunks)
            parts = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs]
        else:
            r = await client.completions.create(**kwargs)
            text, parts = r.choices[0].text, [r.choices[0].logprobs]
        tokens = [t for p in parts for t in p.tokens]
        offsets = [o for p in parts for o in p.text_offset]
        assert text == "echo: a b c" and "".join(tokens) == text
        assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
        for p in parts:
            assert len(p.token_logprobs) == len(p.tokens) == len(p.top_logprobs)
            for token, value, top in zip(p.tokens, p.token_logprobs, p.top_logprobs, strict=True):
                assert value <= 0 and len(top) == 2 and top[token] == value

    asyncio.run(run())


def test_n_choices_non_stream_chat_and_completion():
    engine = FakeEngine("m", 64)

    async def run():
        client = await _client(engine)
        r = await client.chat.completions.create(
            model="m", messages=MSG, n=3, seed=7, logprobs=True, top_logprobs=1
        )
        assert [c.index for c in r.choices] == [0, 1, 2]
        for c in r.choices:
            assert c.message.content == REPLY and c.finish_reason == "stop"
            _check_chat_logprobs(c.logprobs.content, REPLY, 1)
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (4, 3 * 4)
        seeds = sorted((q.request_id[-2:], q.body.seed, q.body.n) for q in engine.requests)
        assert seeds == [("-0", 7, 1), ("-1", 8, 1), ("-2", 9, 1)]  # seed + i: reproducible
        done = await client.completions.create(model="m", prompt="a b", n=2, max_tokens=2)
        assert [(c.index, c.text) for c in done.choices] == [(0, "echo: a"), (1, "echo: a")]
        assert done.usage.completion_tokens == 4 and done.usage.prompt_tokens == 2

    asyncio.run(run())


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_n_choices_stream(kind):
    async def run():
        client = await _client(FakeEngine("m", 64, accept_per_step=1))
        options = {"stream": True, "stream_options": {"include_usage": True}, "n": 2}
        if kind == "chat":
            stream = await client.chat.completions.create(model="m", messages=MSG, **options)
        else:
            stream = await client.completions.create(model="m", prompt="hi you there", **options)
        texts, finishes, usage = {0: "", 1: ""}, {}, None
        async for chunk in stream:
            usage = chunk.usage or usage
            for c in chunk.choices:
                texts[c.index] += (c.delta.content or "") if kind == "chat" else c.text
                if c.finish_reason:
                    finishes[c.index] = c.finish_reason
        assert texts == {0: REPLY, 1: REPLY} and finishes == {0: "stop", 1: "stop"}
        assert (usage.prompt_tokens, usage.completion_tokens) == (4 if kind == "chat" else 3, 8)

    asyncio.run(run())


@pytest.mark.parametrize(
    ("kind", "extra", "param"),
    [
        ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("chat", {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),  # vLLM: all
        ("completion", {"logprobs": 21}, "logprobs"),
        ("completion", {"logprobs": -1}, "logprobs"),
        ("completion", {"logprobs": 1, "echo": True}, "echo"),
        ("chat", {"prompt_logprobs": 1}, "prompt_logprobs"),
        ("chat", {"n": 9}, "n"),
        ("chat", {"n": 0}, "n"),
        ("completion", {"n": 9}, "n"),
        ("completion", {"n": 2, "use_beam_search": True}, "use_beam_search"),
    ],
)
def test_out_of_bounds_are_400(kind, extra, param):
    engine = FakeEngine("m", 64)

    async def run():
        client = await _client(engine)
        with pytest.raises(openai.BadRequestError) as err:
            if kind == "chat":
                await client.chat.completions.create(model="m", messages=MSG, extra_body=extra)
            else:
                await client.completions.create(model="m", prompt="x", extra_body=extra)
        assert err.value.body["param"] == param

    asyncio.run(run())
    assert not engine.requests


def test_n_counts_n_places_in_the_queue():
    """The model admits 4 sequences (2 running, 2 queued): n=4 fits alone, n=5 never
    does (400 too_many_choices: a retry could not help), and each choice's place is given
    back."""

    async def run():
        model = {"max_num_seqs": 2, "replicas": {"max_replicas": 1}}
        client = await _client(model=model, max_queue_len=2)
        r = await client.chat.completions.create(model="m", messages=MSG, n=4, max_tokens=1)
        assert len(r.choices) == 4
        with pytest.raises(openai.BadRequestError) as err:
            await client.chat.completions.create(model="m", messages=MSG, n=5, max_tokens=1)
        assert err.value.status_code == 400 and err.value.code == "too_many_choices"
        r = await client.chat.completions.create(model="m", messages=MSG, n=4, max_tokens=1)
        assert len(r.choices) == 4  # places released after the first

    asyncio.run(run())


def test_token_reservation_counts_the_output_of_every_choice():
    from agentserve.admission.shares import estimate_prompt_tokens, token_reservation
    from agentserve.api.ask import ask_of
    from agentserve.api.openai import parse_request

    def ask(body):
        return ask_of("chat", parse_request("chat", {"model": "m", "messages": MSG, **body}))

    one, three = ask({"max_tokens": 10}), ask({"max_tokens": 10, "n": 3})
    prompt = estimate_prompt_tokens(one)
    assert token_reservation(one, 64) == prompt + 10
    assert token_reservation(three, 64) == prompt + 3 * 10
    unbounded = ask({"n": 2})
    assert token_reservation(unbounded, 64) == prompt + 2 * (64 - prompt)
