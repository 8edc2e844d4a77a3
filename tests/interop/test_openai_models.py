"""The real `openai` Python client (pinned in requirements.txt) against `loadlink route` in front
of two `loadlink engine`s that serve different models: it lists both models, gets its own
`NotFoundError` (with `code == "model_not_found"`) for a model nobody serves, and each model's
requests succeed and are served by that model's engine, as the engines' own counters show.

What the client does with the answers is the point: it parses `/v1/models` into its `Model`
objects, and turns a 404 whose body is OpenAI's error object into `NotFoundError` with the
object's fields as attributes."""

from __future__ import annotations

import re

import openai
import pytest

from conftest import loadlink_bin
from live import get_json, http, responds, start_engine, wait_until
from test_publish_interop import free_port_block

MODELS = ("alpha", "beta")


def model_requests(engine: str) -> dict[str, float]:
    """An engine's `loadlink_engine_model_requests_total`, label → count."""
    status, body, _ = http(engine + "/metrics")
    assert status == 200
    pattern = r'^loadlink_engine_model_requests_total\{model="([^"]*)"\} (\S+)$'
    return {m: float(v) for m, v in re.findall(pattern, body.decode(), re.M)}


@pytest.fixture
def fleet(procs):
    engines = {m: start_engine(procs, free_port_block(1), "--served-model-name", m) for m in MODELS}
    port = free_port_block(1)
    router = f"http://127.0.0.1:{port}"
    procs.spawn([loadlink_bin(), "route", "--worker-urls", *engines.values(), "--port", str(port),
                 "--duration", "120"])
    wait_until("the router to serve", lambda: responds(router + "/health"))

    def both_listed():
        ids = sorted(m["id"] for m in get_json(router + "/v1/models")["data"])
        return ids == sorted(MODELS)

    wait_until("the router to list both models", both_listed)
    return router, engines


def client(router: str) -> openai.OpenAI:
    # No retries: a retried 404 would hide how many requests the router answered.
    return openai.OpenAI(base_url=router + "/v1", api_key="unused", max_retries=0, timeout=30)


def test_the_client_lists_both_models(fleet):
    router, engines = fleet
    listed = {m.id: m for m in client(router).models.list()}
    assert sorted(listed) == sorted(MODELS)
    for name, model in listed.items():
        assert model.object == "model"
        # loadlink's addition, kept by the client as an extra field: the workers serving it.
        assert (model.model_extra or {}).get("workers") == [engines[name]], model


def test_an_unknown_model_raises_not_found(fleet):
    router, engines = fleet
    with pytest.raises(openai.NotFoundError) as caught:
        client(router).completions.create(model="nope", prompt="hello", max_tokens=2)
    err = caught.value
    assert err.status_code == 404
    assert err.code == "model_not_found"
    assert err.param == "model"
    assert err.type == "invalid_request_error"
    assert isinstance(err.body, dict) and err.body["code"] == "model_not_found", err.body
    assert "nope" in err.body["message"], err.body
    with pytest.raises(openai.NotFoundError) as caught:
        client(router).chat.completions.create(
            model="nope", messages=[{"role": "user", "content": "hello"}], max_tokens=2)
    assert caught.value.code == "model_not_found"
    for url in engines.values():
        assert sum(model_requests(url).values()) == 0, "a request for nope reached an engine"


def test_each_model_is_served_by_its_engine(fleet):
    router, engines = fleet
    c = client(router)
    for name in MODELS:
        for _ in range(3):
            done = c.completions.create(model=name, prompt="hello there", max_tokens=2)
            assert done.choices and done.choices[0].text is not None
        chat = c.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "hello"}], max_tokens=2)
        assert chat.choices[0].message is not None
        streamed = list(c.completions.create(model=name, prompt="hello", max_tokens=2, stream=True))
        assert streamed, "a stream with no chunks"
    for name, url in engines.items():
        counts = model_requests(url)
        assert counts.get(name) == 5, (url, counts)
        assert counts.get("<unserved>", 0) == 0, (url, counts)
