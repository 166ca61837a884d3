"""fusegrad-llm: chat with a GGUF model in the terminal, or serve it over an OpenAI-compatible HTTP API.

    fusegrad-llm chat --model FILE.gguf [--temperature T --top-k K --top-p P --seed S --max-tokens N]
    fusegrad-llm serve --model FILE.gguf [--host 127.0.0.1 --port 8000]

The server is Starlette on uvicorn: a small, well-kept ASGI toolkit whose StreamingResponse speaks server-sent events
and notices a client that hangs up, on the standard ASGI server; neither adds a framework or a validation layer we
would have to work around. The model runs on one worker thread, one request at a time, in arrival order; a request
whose client disconnects is cancelled at its next token."""

from __future__ import annotations

import argparse
import asyncio
import json
import queue
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fusegrad.helpers import DEBUG
from fusegrad.models.generate import Sampling, generate
from fusegrad.models.gguf_tokenizer import GGUFTokenizer
from fusegrad.models.llama import Llama


class RequestError(Exception):
    """A client error, reported in OpenAI's error format."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


class Engine:
    """A GGUF model and its tokenizer; generation streams text pieces as tokens come."""

    def __init__(self, path: str | Path, max_context: int | None = None, progress: bool = True):
        self.model, kv = Llama.from_gguf(path, max_context, progress=progress)
        self.tokenizer = GGUFTokenizer(kv)
        self.model_id = Path(path).stem
        self.tokens_generated = 0  # all requests together: lets tests see that a cancelled request stopped

    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages)
        bos = self.tokenizer.tokens[self.tokenizer.bos_id] if self.tokenizer.bos_id is not None else None
        return self.tokenizer.encode(text, add_bos=False if bos and text.startswith(bos) else None)

    def check_length(self, prompt: list[int], max_tokens: int) -> None:
        limit = self.model.max_context
        if not prompt:
            raise RequestError(400, "the prompt is empty", "prompt")
        if len(prompt) + max_tokens > limit:
            raise RequestError(
                400,
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{len(prompt) + max_tokens} tokens ({len(prompt)} in the prompt, {max_tokens} for the completion).",
                "max_tokens",
                "context_length_exceeded",
            )

    def stream(
        self,
        prompt: list[int],
        max_tokens: int,
        sampling: Sampling,
        seed: int | None = None,
        stop: list[str] | None = None,
        cancelled: threading.Event | None = None,
        on_first_token: Callable[[], None] | None = None,
    ) -> Iterator[tuple[str, str | None, int]]:
        """(text piece, finish reason or None, tokens generated so far) as tokens come; the last item carries the
        finish reason, "stop" or "length". `on_first_token` is called once the prompt is processed and the first
        token sampled."""
        self.check_length(prompt, max_tokens)
        self.model.reset()
        ids: list[int] = []
        sent, finish, count, hit = "", "length", 0, -1
        holdback = max((len(s) for s in stop or []), default=1) - 1
        for count, token in enumerate(
            generate(self.model, prompt, max_tokens, sampling, seed, self.tokenizer.stop_ids), 1
        ):
            self.tokens_generated += 1
            if count == 1 and on_first_token is not None:
                on_first_token()
            if cancelled is not None and cancelled.is_set():
                return
            if token in self.tokenizer.stop_ids:
                finish = "stop"
                break
            ids.append(token)
            text = self.tokenizer.decode(ids)
            if text.endswith("\ufffd"):
                continue  # the token ends inside a UTF-8 character: wait for the rest
            hit = min((i for s in stop or [] if (i := text.find(s, max(0, len(sent) - holdback))) >= 0), default=-1)
            if hit >= 0:
                if hit > len(sent):
                    yield text[len(sent) : hit], None, count
                sent, finish = text[:hit], "stop"
                break
            ready = len(text) - holdback if stop else len(text)
            if ready > len(sent):
                yield text[len(sent) : ready], None, count
                sent = text[:ready]
        if hit < 0:  # flush what a stop string held back, or a character still incomplete
            text = self.tokenizer.decode(ids) if ids else ""
            if len(text) > len(sent):
                yield text[len(sent) :], None, count
        yield "", finish, count


# ------------------------------------------------------------------ chat


def chat(args: argparse.Namespace) -> None:
    engine = Engine(args.model, args.ctx)
    sampling = Sampling(args.temperature, args.top_k, args.top_p)
    messages: list[dict[str, str]] = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    print(f"chatting with {engine.model_id} (Ctrl-C stops a reply, Ctrl-D or /exit quits)")
    while True:
        try:
            user = input("> ")
        except (EOFError, KeyboardInterrupt):
            print()
            return
        if user.strip() in ("/exit", "/quit"):
            return
        if not user.strip():
            continue
        messages.append({"role": "user", "content": user})
        prompt = engine.chat_prompt(messages)
        budget = min(args.max_tokens, engine.model.max_context - len(prompt))
        if budget <= 0:
            print(f"[the conversation fills the context of {engine.model.max_context} tokens; start a new chat]")
            messages.pop()
            continue
        reply = ""
        try:
            for piece, _, _ in engine.stream(prompt, budget, sampling, args.seed):
                reply += piece
                sys.stdout.write(piece)
                sys.stdout.flush()
        except KeyboardInterrupt:
            sys.stdout.write(" [stopped]")
        print()
        messages.append({"role": "assistant", "content": reply})


# ------------------------------------------------------------------ server


@dataclass
class Job:
    prompt: list[int]
    max_tokens: int
    sampling: Sampling
    seed: int | None
    stop: list[str]
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    received: float = field(default_factory=time.perf_counter)
    first_token: float | None = None  # perf_counter() when the first token was sampled

    def mark_first_token(self) -> None:
        self.first_token = time.perf_counter()
        if DEBUG >= 1:
            print(f"first token {(self.first_token - self.received) * 1000:.1f} ms after the request")

    def usage(self, completion: int) -> dict:
        n = len(self.prompt)
        ttft = None if self.first_token is None else round((self.first_token - self.received) * 1000, 3)
        return {
            "prompt_tokens": n,
            "completion_tokens": completion,
            "total_tokens": n + completion,
            "time_to_first_token_ms": ttft,
        }


class Worker:
    """Runs jobs one at a time on its own thread and hands their pieces to the event loop."""

    def __init__(self, engine: Engine):
        self.engine, self.jobs = engine, queue.Queue()
        threading.Thread(target=self.run, name="fusegrad-llm-worker", daemon=True).start()

    def run(self) -> None:
        while True:
            job: Job = self.jobs.get()
            try:
                if job.cancelled.is_set():
                    continue
                stream = self.engine.stream(
                    job.prompt, job.max_tokens, job.sampling, job.seed, job.stop, job.cancelled, job.mark_first_token
                )
                for item in stream:
                    job.loop.call_soon_threadsafe(job.out.put_nowait, item)
                job.loop.call_soon_threadsafe(job.out.put_nowait, None)
            except Exception as e:  # the request fails, the server goes on
                job.loop.call_soon_threadsafe(job.out.put_nowait, e)

    async def pieces(self, job: Job):
        """The job's (piece, finish) items; cancels the job if the consumer goes away."""
        self.jobs.put(job)
        try:
            while (item := await job.out.get()) is not None:
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            job.cancelled.set()


def _number(body: dict, key: str, default: Any, kind: type, low: float, high: float) -> Any:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise RequestError(400, f"'{key}' must be a {kind.__name__}, got {value!r}", key)
    if not low <= value <= high:
        raise RequestError(400, f"'{key}' must be in [{low}, {high}], got {value}", key)
    return kind(value)


def create_app(engine: Engine) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    worker = Worker(engine)

    async def read_request(request: Request) -> dict:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RequestError(400, f"the request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise RequestError(400, f"the request body must be a JSON object, got {type(body).__name__}")
        if body.get("model") != engine.model_id:
            raise RequestError(404, f"The model '{body.get('model')}' does not exist", "model", "model_not_found")
        if _number(body, "n", 1, int, 1, 1) != 1:
            raise RequestError(400, "only n=1 is supported", "n")
        return body

    def job_of(body: dict, prompt: list[int], default_max: int) -> Job:
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 4:
            raise RequestError(400, f"'stop' must be a string or up to 4 non-empty strings, got {stop!r}", "stop")
        max_tokens = _number(body, "max_tokens", default_max, int, 0, 1 << 30)
        max_tokens = _number(body, "max_completion_tokens", max_tokens, int, 0, 1 << 30)
        sampling = Sampling(
            _number(body, "temperature", 1.0, float, 0, 2),
            _number(body, "top_k", 0, int, 0, 1 << 30),
            _number(body, "top_p", 1.0, float, 1e-9, 1),
        )
        seed = _number(body, "seed", None, int, -(1 << 63), (1 << 63) - 1)
        engine.check_length(prompt, max_tokens)
        return Job(prompt, max_tokens, sampling, seed, stop, asyncio.get_running_loop())

    async def respond(body: dict, job: Job, kind: str):
        ident, created = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}", int(time.time())
        obj = "chat.completion" if kind == "chat" else "text_completion"
        head = {"id": ident, "created": created, "model": engine.model_id}

        def choice(text: str, finish: str | None, stream: bool) -> dict:
            if kind == "chat":
                key = "delta" if stream else "message"
                msg = {"content": text} if stream else {"role": "assistant", "content": text}
                return {"index": 0, key: msg if text or not stream else {}, "finish_reason": finish, "logprobs": None}
            return {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}

        if not body.get("stream"):
            text, finish, count = "", "length", 0
            async for piece, done, count in worker.pieces(job):
                text += piece
                finish = done or finish
            return JSONResponse(
                {**head, "object": obj, "choices": [choice(text, finish, False)], "usage": job.usage(count)}
            )

        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        chunk_obj = "chat.completion.chunk" if kind == "chat" else "text_completion"

        async def events():
            if kind == "chat":
                first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                yield f"data: {json.dumps({**head, 'object': chunk_obj, 'choices': [first]})}\n\n"
            count = 0
            async for piece, done, count in worker.pieces(job):
                if piece or done:
                    chunk = {**head, "object": chunk_obj, "choices": [choice(piece, done, True)]}
                    yield f"data: {json.dumps(chunk)}\n\n"
            if include_usage:
                tail = {**head, "object": chunk_obj, "choices": [], "usage": job.usage(count)}
                yield f"data: {json.dumps(tail)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def completions(request: Request):
        body = await read_request(request)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = engine.tokenizer.encode(prompt)
        elif (
            isinstance(prompt, list) and prompt and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt)
        ):
            if bad := [i for i in prompt if not 0 <= i < engine.model.cfg.vocab_size]:
                raise RequestError(400, f"prompt token ids {bad[:8]} are outside the vocabulary", "prompt")
            ids = list(prompt)
        else:
            raise RequestError(400, "'prompt' must be a string or a list of token ids", "prompt")
        return await respond(body, job_of(body, ids, 16), "text")

    async def chat_completions(request: Request):
        body = await read_request(request)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError(400, "'messages' must be a non-empty list", "messages")
        plain = []
        for m in messages:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, list):  # content parts: only text parts carry meaning here
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(content, str):
                raise RequestError(400, f"each message needs a 'role' and text 'content', got {m!r:.200}", "messages")
            plain.append({"role": m["role"], "content": content})
        try:
            ids = engine.chat_prompt(plain)
        except ValueError as e:
            raise RequestError(400, str(e), "messages") from None
        return await respond(body, job_of(body, ids, engine.model.max_context), "chat")

    async def models(request: Request):
        card = {"id": engine.model_id, "object": "model", "created": 0, "owned_by": "fusegrad"}
        return JSONResponse({"object": "list", "data": [card]})

    async def request_error(request: Request, exc: Exception):
        assert isinstance(exc, RequestError)
        return JSONResponse(exc.body(), status_code=exc.status)

    async def not_found(request: Request, exc: Exception):
        return JSONResponse(RequestError(404, f"no route {request.method} {request.url.path}").body(), status_code=404)

    async def server_error(request: Request, exc: Exception):
        return JSONResponse(RequestError(500, f"{type(exc).__name__}: {exc}").body(), status_code=500)

    routes = [
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    ]
    handlers = {RequestError: request_error, 404: not_found, 405: not_found, Exception: server_error}
    app = Starlette(routes=routes, exception_handlers=handlers)
    app.state.engine = engine
    return app


def serve(args: argparse.Namespace) -> None:
    import uvicorn

    app = create_app(Engine(args.model, args.ctx))
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="fusegrad-llm", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("chat", "serve"):
        p = sub.add_parser(name)
        p.add_argument("--model", required=True, help="a GGUF file")
        p.add_argument("--ctx", type=int, default=None, help="context length (default: the model's, at most 4096)")
        if name == "chat":
            p.add_argument("--temperature", type=float, default=0.7)
            p.add_argument("--top-k", type=int, default=40)
            p.add_argument("--top-p", type=float, default=0.95)
            p.add_argument("--seed", type=int, default=None)
            p.add_argument("--max-tokens", type=int, default=512)
            p.add_argument("--system", default=None, help="a system message")
        else:
            p.add_argument("--host", default="127.0.0.1")
            p.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    if not Path(args.model).is_file():
        parser.error(f"--model {args.model}: no such file")
    if args.ctx is None:
        args.ctx = 4096
    try:
        Sampling(getattr(args, "temperature", 0.0), getattr(args, "top_k", 0), getattr(args, "top_p", 1.0))
    except ValueError as e:
        parser.error(str(e))
    (chat if args.command == "chat" else serve)(args)


if __name__ == "__main__":
    main()
