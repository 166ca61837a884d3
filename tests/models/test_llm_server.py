"""fusegrad-llm serve driven by the official openai client over the loopback: models, completions, chat, streaming,
usage, concurrent requests, a client that hangs up mid-stream, and OpenAI-format errors; and the chat command."""

import http.client
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

openai = pytest.importorskip("openai", reason="the test extra installs openai")
pytest.importorskip("uvicorn", reason="the models extra installs uvicorn")
pytest.importorskip("transformers", reason="the test extra installs transformers")

import uvicorn  # noqa: E402
from gguf_models import bpe_tokenizer, make_model, write_gguf  # noqa: E402

from fusegrad.apps.llm import Engine, create_app  # noqa: E402
from fusegrad.models.generate import Sampling, generate  # noqa: E402


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = tmp_path_factory.mktemp("llm") / "tiny.gguf"
    ref = make_model("qwen2", vocab_size=320, max_position_embeddings=96, std=0.1)
    write_gguf(ref, "qwen2", path, "Q8_0", tokenizer=bpe_tokenizer(320))
    engine = Engine(path, progress=False)
    server = uvicorn.Server(uvicorn.Config(create_app(engine), host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=300)
    yield engine, client, f"http://127.0.0.1:{port}", path
    server.should_exit = True
    thread.join(timeout=10)


def raw_request(url: str, method: str, path: str, body: bytes | None = None) -> http.client.HTTPResponse:
    """A plain HTTP request (the openai client cannot send malformed JSON or hang up mid-stream)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
    return conn.getresponse()


def expected_text(engine, prompt_ids, n):
    engine.model.reset()
    ids = [t for t in generate(engine.model, prompt_ids, n, Sampling()) if t not in engine.tokenizer.stop_ids]
    return engine.tokenizer.decode(ids)


def test_models_and_completion_match_direct_generation(served):
    engine, client, _, _ = served
    assert [m.id for m in client.models.list().data] == ["tiny"]
    out = client.completions.create(model="tiny", prompt="The quick brown", max_tokens=12, temperature=0)
    prompt_ids = engine.tokenizer.encode("The quick brown")
    assert out.choices[0].text == expected_text(engine, prompt_ids, 12)
    assert out.usage.prompt_tokens == len(prompt_ids) and out.usage.completion_tokens <= 12
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    assert out.choices[0].finish_reason in ("length", "stop")


def test_usage_reports_the_time_to_first_token(served):
    _, client, _, _ = served
    st = time.perf_counter()
    out = client.completions.create(model="tiny", prompt="A longer prompt " * 3, max_tokens=6, temperature=0)
    elapsed_ms = (time.perf_counter() - st) * 1000
    assert 0 < out.usage.time_to_first_token_ms < elapsed_ms
    stream = client.completions.create(
        model="tiny", prompt="Hi", max_tokens=4, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    assert list(stream)[-1].usage.time_to_first_token_ms > 0


def test_streaming_equals_the_whole_reply(served):
    _, client, _, _ = served
    whole = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hello, fox!"}], max_tokens=15, temperature=0
    )
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Hello, fox!"}],
        max_tokens=15,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content and whole.choices[0].message.role == "assistant"
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason
    pieces = list(client.completions.create(model="tiny", prompt="Hello", max_tokens=8, temperature=0, stream=True))
    assert (
        "".join(p.choices[0].text for p in pieces)
        == client.completions.create(model="tiny", prompt="Hello", max_tokens=8, temperature=0).choices[0].text
    )


def test_concurrent_requests_each_get_their_own_answer(served):
    _, client, _, _ = served
    prompts = ["The quick", "Hello, world", "How are you", "The lazy dog"]

    def ask(p):
        return client.completions.create(model="tiny", prompt=p, max_tokens=6, temperature=0, seed=1).choices[0].text

    alone = [ask(p) for p in prompts]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(ask, prompts * 2))
    assert together == alone * 2


def test_sampling_is_seeded(served):
    _, client, _, _ = served

    def ask(seed):
        kw = dict(model="tiny", prompt="The", max_tokens=10, temperature=1.0, top_p=0.9, seed=seed)
        return client.completions.create(**kw).choices[0].text

    assert ask(5) == ask(5)


def test_client_disconnecting_mid_stream_cancels_its_generation(served):
    engine, client, url, _ = served
    before = engine.tokens_generated
    body = {"model": "tiny", "prompt": "The", "max_tokens": 80, "temperature": 0, "stream": True}
    r = raw_request(url, "POST", "/v1/completions", json.dumps(body).encode())
    assert r.status == 200
    assert r.readline().startswith(b"data: ")  # one event, then hang up
    r.close()
    out = client.completions.create(model="tiny", prompt="Hello", max_tokens=3, temperature=0)
    assert out.choices[0].finish_reason is not None
    assert engine.tokens_generated - before < 80  # the cancelled request stopped early


def test_errors_use_the_openai_format(served):
    _, client, url, _ = served
    r = raw_request(url, "POST", "/v1/completions", b"{not json")
    assert r.status == 400 and json.loads(r.read())["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-9", prompt="x", max_tokens=2)
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="x", max_tokens=500)
    assert e.value.body["code"] == "context_length_exceeded" and "96" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[], max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt="x", max_tokens=2, temperature=-1)
    r = raw_request(url, "GET", "/v1/nothing")
    assert r.status == 404 and json.loads(r.read())["error"]["message"].startswith("no route")
    ok = client.completions.create(model="tiny", prompt="x", max_tokens=2, temperature=0)  # still serving
    assert ok.choices[0].finish_reason in ("length", "stop")


def test_chat_command_streams_a_reply(served):
    engine, _, _, path = served
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    cmd = [
        sys.executable,
        "-m",
        "fusegrad.apps.llm",
        "chat",
        "--model",
        str(path),
        "--temperature",
        "0",
        "--max-tokens",
        "8",
    ]
    out = subprocess.run(cmd, input="Hello, fox!\n/exit\n", capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr
    prompt = engine.chat_prompt([{"role": "user", "content": "Hello, fox!"}])
    assert expected_text(engine, prompt, 8) in out.stdout


def test_ctrl_c_stops_a_reply_not_the_chat(served, monkeypatch, capsys):
    """A KeyboardInterrupt while a reply streams ends that reply; the chat goes on to the next prompt."""
    import argparse

    import fusegrad.apps.llm as llm

    engine, _, _, path = served
    real_stream = engine.stream
    calls = []

    def interrupted_stream(*args, **kwargs):
        calls.append(args[0])
        for i, item in enumerate(real_stream(*args, **kwargs)):
            if len(calls) == 1 and i == 2:
                raise KeyboardInterrupt
            yield item

    monkeypatch.setattr(llm, "Engine", lambda *a, **k: engine)
    monkeypatch.setattr(engine, "stream", interrupted_stream)
    lines = iter(["Hello, fox!", "How are you?", "/exit"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    args = argparse.Namespace(
        model=str(path), ctx=None, temperature=0.0, top_k=0, top_p=1.0, seed=None, max_tokens=6, system=None
    )
    llm.chat(args)
    out = capsys.readouterr().out
    assert out.count("[stopped]") == 1 and len(calls) == 2
    # the interrupted reply stays in the conversation: the second prompt holds both turns
    assert engine.tokenizer.decode(calls[1]).count("Hello, fox!") == 1
