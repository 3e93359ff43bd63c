"""`clover-cpu serve`: an OpenAI-compatible HTTP server (FastAPI on uvicorn).

Endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health, GET /metrics
(Prometheus text), GET / (a chat page). Requests decode in clover_cpu.engine's batching engine; chat
prompts are rendered by the file's chat template in the sandboxed renderer (clover_cpu.chat), tool calls
are parsed from the reply (clover_cpu.toolcalls). Errors are OpenAI-style JSON objects with a 4xx status:
bad JSON, wrong types and values we cannot honour get 400 naming the field, a full queue 429 with
Retry-After, a missing or wrong API key 401, an oversized body 413.
"""

from __future__ import annotations

import asyncio
import codecs
import hmac
import json
import secrets
import threading
import time
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Optional, Union

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from .decode import MAX_BLOCK_LENGTH, MAX_TOP_LOGPROBS, Options, context_needed
from .engine import Engine, Job, QueueFull

# ---- request bodies (OpenAI's schema; unknown fields are ignored) ----


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextPart(_Body):
    type: str
    text: Optional[str] = None


class FunctionCall(_Body):
    name: str
    arguments: Union[str, dict] = "{}"


class ToolCall(_Body):
    id: Optional[str] = None
    type: str = "function"
    function: FunctionCall


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[TextPart], None] = None
    name: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None
    tool_call_id: Optional[str] = None
    reasoning_content: Optional[str] = None


class FunctionDef(_Body):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1, max_length=256)
    description: Optional[str] = None
    parameters: Optional[dict] = None


class Tool(_Body):
    type: Literal["function"] = "function"
    function: FunctionDef


class StreamOptions(_Body):
    include_usage: bool = False


class CloverFields(_Body):
    """Clover's decoding options, as `clover-cpu run` names and checks them."""

    threshold: Optional[float] = Field(None, gt=0, le=1)
    block_length: Optional[int] = Field(None, ge=1, le=MAX_BLOCK_LENGTH)
    max_steps: Optional[int] = Field(None, ge=1, le=4096)
    window: int = Field(0, ge=0, le=4096)
    reuse: bool = False
    # (reuse=True is mode "reuse"; auto: reuse with a window chosen per forward, as run --mode auto)
    mode: Optional[Literal["exact", "reuse", "auto"]] = None
    policy: Literal["threshold", "fixed"] = "threshold"
    scorer: Literal["prob", "margin", "entropy"] = "prob"
    top_k: int = Field(0, ge=0)
    ignore_eos: bool = False
    # start from a finished request's caches where they hold the start of the prompt (llama-server's name)
    cache_prompt: bool = True
    show_steps: bool = False  # streamed: each denoising step's block ("clover_step" chunks; masks as null)


class Sampling(CloverFields):
    model: Optional[str] = None
    max_tokens: Optional[int] = Field(None, ge=0)
    temperature: Optional[float] = Field(None, ge=0, le=2)
    top_p: Optional[float] = Field(None, gt=0, le=1)
    seed: Optional[int] = None
    stop: Union[str, list[str], None] = None
    n: Optional[int] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    logprobs: Union[bool, int, None] = None
    top_logprobs: Optional[int] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    logit_bias: Optional[dict[str, float]] = None  # token id (a string, as in JSON) -> bias, -100 .. 100


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(None, ge=0)
    tools: Optional[list[Tool]] = None
    tool_choice: Union[Literal["none", "auto", "required"], dict, None] = None
    parallel_tool_calls: Optional[bool] = None
    response_format: Optional[dict] = None
    chat_template_kwargs: Optional[dict] = None


class CompletionRequest(Sampling):
    prompt: Union[str, list[int], list[str]]
    echo: bool = False
    suffix: Optional[str] = None
    best_of: Optional[int] = None


class TokenizeRequest(_Body):
    """llama-server's /tokenize: text to token ids (parse_special: control-token strings become tokens)."""

    content: str
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(_Body):
    tokens: list[int]


# ---- errors ----


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, type_: str = "invalid_request_error",
                 headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.headers = status, message, param, type_, headers


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None, code=None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _error_response(e: APIError) -> JSONResponse:
    return JSONResponse(error_body(e.message, e.type, e.param), status_code=e.status, headers=e.headers)


# ---- settings ----


class Settings:
    """What `clover-cpu serve` passes to the app."""

    def __init__(self, model_path, *, parallel: int = 4, api_key: str | None = None, max_queue: int = 64,
                 max_body_bytes: int = 4 << 20, max_tokens_limit: int | None = None, default_max_tokens: int = 512,
                 threads: int | None = None, ctx_len: int | None = None, kv_type: str = "f16", alias: str | None = None,
                 prefill_slice: int = 256, cache_slots: int | None = None, load=None):
        self.model_path = Path(model_path)
        self.parallel, self.api_key, self.max_queue = parallel, api_key, max_queue
        self.max_body_bytes, self.max_tokens_limit, self.default_max_tokens = max_body_bytes, max_tokens_limit, \
            default_max_tokens
        self.threads, self.ctx_len, self.kv_type = threads, ctx_len, kv_type
        self.alias = alias or self.model_path.stem
        self.prefill_slice = prefill_slice
        self.cache_slots = cache_slots
        self.load = load  # (tests: a function returning the model)


class BodyLimit:
    """ASGI middleware: a request body over `limit` bytes gets 413 before the app reads it whole; counts the
    HTTP requests in `counter.http_requests`."""

    def __init__(self, app, limit: int, counter):
        self.app, self.limit, self.counter = app, limit, counter

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        self.counter.http_requests += 1
        for k, v in scope.get("headers", []):
            if k == b"content-length":
                try:
                    n = int(v)
                except ValueError:
                    n = -1
                if n < 0 or n > self.limit:
                    return await self._reject(send, n < 0)
        seen = 0

        async def limited():
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge()
            return msg

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await self._reject(send, False)

    async def _reject(self, send, bad: bool):
        msg = "invalid Content-Length" if bad else f"request body larger than {self.limit} bytes"
        body = json.dumps(error_body(msg)).encode()
        await send({"type": "http.response.start", "status": 400 if bad else 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    pass


# ---- the app ----


class State:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.model = None
        self.engine: Engine | None = None
        self.load_error: str | None = None
        self.loaded = threading.Event()
        self.started = time.time()
        self.http_requests = 0
        self.ttft_sum = 0.0
        self.ttft_n = 0
        self.template = None  # the chat template requests render through (the file's, else ChatML)

    def load(self) -> None:
        s = self.settings
        try:
            if s.load is not None:
                self.model = s.load()
            else:
                import clover_cpu

                self.model = clover_cpu.load(s.model_path, threads=s.threads, ctx_len=s.ctx_len, kv_type=s.kv_type)
            self.template = self.model.chat_template
            if self.template is None:  # a file without one (a base model): ChatML, as llama-server falls back to
                from .chat import ChatTemplate

                self.template = ChatTemplate(CHATML, tokenizer=self.model.tokenizer,
                                             special_tokens=self.model.tokenizer.special_token_strings())
                self.model.use_fallback_template(self.template)
            self.model.user_turn_ids  # (found now, not on the first request: it renders the template once)
            self.engine = Engine(self.model, parallel=s.parallel, max_queue=s.max_queue, prefill_slice=s.prefill_slice,
                                 cache_slots=s.cache_slots)
        except Exception as e:  # reported by /health and every request
            self.load_error = f"{type(e).__name__}: {e}"
        finally:
            self.loaded.set()


def create_app(settings: Settings) -> FastAPI:
    state = State(settings)

    async def lifespan(app):
        threading.Thread(target=state.load, name="clover-load", daemon=True).start()
        yield
        if state.engine is not None:
            await run_in_threadpool(state.engine.shutdown, 10.0, cancel=True)

    # (no /docs or /redoc: their pages load scripts from a CDN; the description stays at /openapi.json)
    app = FastAPI(title="clover-cpu", version=_version(), lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="An OpenAI-compatible server for Clover and Qwen3.5-MoE GGUF files on the CPU.")
    app.state.clover = state

    @app.exception_handler(APIError)
    async def _api_error(request, e: APIError):
        return _error_response(e)

    @app.exception_handler(RequestValidationError)
    async def _validation(request, e: RequestValidationError):
        errs = e.errors()
        first = errs[0] if errs else {}
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        param = ".".join(loc) or None
        if first.get("type") == "json_invalid":
            msg, param = "the request body is not valid JSON", None
        elif first.get("type") == "model_attributes_type":
            msg = "the request body must be a JSON object"
        else:
            msg = f"{param}: {first.get('msg', 'invalid value')}" if param else first.get("msg", "invalid request")
        return JSONResponse(error_body(msg, param=param), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, e: StarletteHTTPException):
        return JSONResponse(error_body(str(e.detail), type_="not_found_error" if e.status_code == 404 else
                                       "invalid_request_error"), status_code=e.status_code)

    @app.exception_handler(Exception)
    async def _unexpected(request, e: Exception):  # a bug: a JSON error, never a traceback to the client
        return JSONResponse(error_body(f"internal error: {type(e).__name__}", type_="server_error"), status_code=500)

    def check_key(request: Request) -> None:
        key = settings.api_key
        if not key:
            return
        auth = request.headers.get("authorization", "")
        given = auth[7:] if auth[:7].lower() == "bearer " else ""
        if not hmac.compare_digest(given.encode(), key.encode()):
            raise APIError(401, "invalid or missing API key (send Authorization: Bearer KEY)",
                           type_="authentication_error")

    def ready():
        if not state.loaded.is_set():
            raise APIError(503, "the model is loading", type_="unavailable_error", headers={"Retry-After": "5"})
        if state.load_error:
            raise APIError(500, f"the model failed to load: {state.load_error}", type_="server_error")
        return state.model, state.engine

    @app.get("/health")
    async def health():
        if not state.loaded.is_set():
            return JSONResponse({"status": "loading"}, status_code=503)
        if state.load_error:
            return JSONResponse({"status": "error", "error": state.load_error}, status_code=500)
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models(request: Request):
        check_key(request)
        model, _ = ready()
        return {"object": "list", "data": [{"id": settings.alias, "object": "model", "created": int(state.started),
                                            "owned_by": "clover-cpu", "meta": _model_meta(model)}]}

    @app.get("/metrics")
    async def metrics(request: Request):
        check_key(request)
        return PlainTextResponse(_prometheus(state), media_type="text/plain; version=0.0.4")

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest, request: Request):
        """Token ids of a text, as llama-server's /tokenize gives them (with_pieces: each id's text too)."""
        check_key(request)
        model, _ = ready()
        ids = await run_in_threadpool(model.tokenize, body.content, special=body.parse_special)
        if not body.with_pieces:
            return {"tokens": ids}
        tok = model.tokenizer
        return {"tokens": [{"id": i, "piece": tok.token_bytes(i).decode("utf-8", errors="replace")} for i in ids]}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest, request: Request):
        """The text of token ids (control tokens included), as llama-server's /detokenize."""
        check_key(request)
        model, _ = ready()
        _check_ids(body.tokens, model.config.vocab_size, "tokens")
        return {"content": model.tokenizer.decode(body.tokens, skip_special=False)}

    @app.get("/", response_class=HTMLResponse)
    async def page():
        return HTMLResponse(resources.files("clover_cpu").joinpath("web/chat.html").read_text(encoding="utf-8"))

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request):
        check_key(request)
        model, engine = ready()
        _check_common(body)
        if body.response_format and body.response_format.get("type") not in (None, "text"):
            raise APIError(400, "response_format other than text is not supported", "response_format")
        if body.tool_choice not in (None, "none", "auto"):
            raise APIError(400, "tool_choice 'required' or a named function is not supported (use 'auto' or 'none')",
                           "tool_choice")
        messages = _messages(body.messages)
        tools = None
        if body.tools and body.tool_choice != "none":
            tools = [t.model_dump(exclude_none=True) for t in body.tools]
        kwargs = dict(body.chat_template_kwargs or {})
        for bad in ("messages", "tools", "add_generation_prompt"):
            if bad in kwargs:
                raise APIError(400, f"chat_template_kwargs may not set {bad}", "chat_template_kwargs")
        prompt_ids, prompt_text = await run_in_threadpool(_render, model, state.template, messages, tools, kwargs)
        max_new = _max_tokens(body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens,
                              settings)
        opts = _options(body, max_new, model, len(prompt_ids), chat=True)
        from .chat import opens_thinking

        thinking = model.has_thinking_tokens() and opens_thinking(prompt_text[-200:])
        reply = _Reply(model, stops=_stops(body.stop), thinking=thinking, tools=tools,
                       reasoning=model.has_thinking_tokens())
        return await _respond(state, engine, request, body, prompt_ids, opts, reply, chat=True)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        check_key(request)
        model, engine = ready()
        _check_common(body)
        if body.echo:
            raise APIError(400, "echo is not supported", "echo")
        if body.suffix:
            raise APIError(400, "suffix is not supported", "suffix")
        if body.best_of not in (None, 1):
            raise APIError(400, "best_of must be 1", "best_of")
        p = body.prompt
        if isinstance(p, list) and p and isinstance(p[0], str):
            if len(p) != 1:
                raise APIError(400, "one prompt per request (a list of several prompts is not supported)", "prompt")
            p = p[0]
        if isinstance(p, str):
            prompt_ids = await run_in_threadpool(model.tokenize, p)
        else:
            _check_ids(p, model.config.vocab_size, "prompt")
            prompt_ids = list(p)
        if not prompt_ids:
            raise APIError(400, "the prompt is empty", "prompt")
        max_new = _max_tokens(body.max_tokens, settings, default=16)
        opts = _options(body, max_new, model, len(prompt_ids), chat=False)
        reply = _Reply(model, stops=_stops(body.stop), thinking=False, tools=None, reasoning=False)
        return await _respond(state, engine, request, body, prompt_ids, opts, reply, chat=False)

    return BodyLimitApp(app, settings.max_body_bytes, state)


class BodyLimitApp(BodyLimit):
    """The FastAPI app behind the body limit; `.app` is the FastAPI app (its state, routes, OpenAPI)."""

    @property
    def state(self):
        return self.app.state

    def openapi(self):
        return self.app.openapi()


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("clover-cpu")
    except Exception:
        return "0"


def _model_meta(model) -> dict:
    c = model.config
    return {"architecture": c.arch if hasattr(c, "arch") else None, "n_ctx": model.ctx_len, "n_vocab": c.vocab_size,
            "diffusion": bool(c.is_diffusion), "block_length": c.block_length,
            "chat_template": model.chat_template is not None}


def _check_common(body: Sampling) -> None:
    if body.n not in (None, 1):
        raise APIError(400, "n must be 1 (one choice per request)", "n")
    stops = _stops(body.stop)
    if len(stops) > 16 or any(len(s) > 256 or not s for s in stops):
        raise APIError(400, "stop: at most 16 non-empty strings of at most 256 characters", "stop")
    if body.window and body.max_steps is not None:
        raise APIError(400, "max_steps and window do not combine", "window")


def _logprobs_k(body: Sampling, chat: bool) -> int | None:
    """How many most likely tokens to report beside each new token's log-probability (None: no logprobs).
    Chat: logprobs true and top_logprobs 0-20; completions: logprobs 0-5 (OpenAI's fields and limits)."""
    lp, top = body.logprobs, body.top_logprobs
    if chat:
        if lp is not None and not isinstance(lp, bool):
            raise APIError(400, "logprobs must be true or false (top_logprobs says how many alternatives)", "logprobs")
        if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
            raise APIError(400, f"top_logprobs must be from 0 to {MAX_TOP_LOGPROBS}", "top_logprobs")
        if top and not lp:
            raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
        return (top or 0) if lp else None
    if top is not None:
        raise APIError(400, "top_logprobs is a chat field; completions take logprobs: N", "top_logprobs")
    if lp is None:
        return None
    if isinstance(lp, bool) or not 0 <= lp <= 5:
        raise APIError(400, "logprobs must be an integer from 0 to 5", "logprobs")
    return lp


def _check_ids(ids, vocab: int, param: str) -> None:
    if any(not 0 <= t < vocab for t in ids):
        raise APIError(400, f"token ids must be in [0, {vocab})", param)


def _stops(stop) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)


def _max_tokens(value, settings: Settings, default: int | None = None) -> int:
    n = value if value is not None else (default if default is not None else settings.default_max_tokens)
    if settings.max_tokens_limit is not None and n > settings.max_tokens_limit:
        raise APIError(400, f"max_tokens must be at most {settings.max_tokens_limit} on this server", "max_tokens")
    return n


def _options(body: Sampling, max_new: int, model, n_prompt: int, chat: bool) -> Options:
    reuse = body.reuse or body.mode == "reuse"
    opts = Options(max_new_tokens=max_new, temperature=body.temperature if body.temperature is not None else 0.0,
                   top_k=body.top_k, top_p=body.top_p if body.top_p is not None else 1.0, seed=body.seed,
                   threshold=body.threshold, block_length=body.block_length, max_steps=body.max_steps,
                   window=body.window, reuse=reuse, policy=body.policy, scorer=body.scorer,
                   stop_at_eos=not body.ignore_eos, mode="auto" if body.mode == "auto" else "exact",
                   presence_penalty=body.presence_penalty or 0.0, frequency_penalty=body.frequency_penalty or 0.0,
                   logprobs=_logprobs_k(body, chat))
    if body.logit_bias:
        try:
            opts.logit_bias = {int(k): v for k, v in body.logit_bias.items()}
        except ValueError:
            raise APIError(400, "logit_bias keys must be token ids", "logit_bias") from None
        _check_ids(opts.logit_bias, model.config.vocab_size, "logit_bias")
    try:
        opts.validate()  # the rules run and the Python API go through (the schema checks types and ranges it knows)
    except ValueError as e:
        raise APIError(400, str(e), str(e).split()[0]) from None
    c = model.config
    if reuse and not c.is_diffusion:
        raise APIError(400, "reuse needs a diffusion model; this one decodes autoregressively", "reuse")
    B = opts.block_length or c.block_length
    end = context_needed(0, n_prompt, max_new, B)
    if end > model.ctx_len:
        raise APIError(400, f"the prompt ({n_prompt} tokens) and max_tokens ({max_new}) do not fit the context of "
                            f"{model.ctx_len} tokens", "max_tokens" if n_prompt < model.ctx_len else "messages")
    return opts


def _text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for p in content:
        if p.type != "text":
            raise APIError(400, f"content parts of type {p.type!r} are not supported (text only)", "messages")
        parts.append(p.text or "")
    return "".join(parts)


def _messages(msgs: list[Message]) -> list[dict]:
    """OpenAI messages as the chat template takes them (Qwen's templates iterate tool call arguments as a
    mapping: the JSON text clients send is parsed)."""
    out = []
    for i, m in enumerate(msgs):
        d: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": _text(m.content)}
        if m.name:
            d["name"] = m.name
        if m.tool_call_id:
            d["tool_call_id"] = m.tool_call_id
        if m.reasoning_content:
            d["reasoning_content"] = m.reasoning_content
        if m.tool_calls:
            calls = []
            for tc in m.tool_calls:
                args = tc.function.arguments
                if isinstance(args, str):
                    try:
                        args = json.loads(args) if args.strip() else {}
                    except ValueError:
                        raise APIError(400, f"messages[{i}].tool_calls: arguments are not valid JSON",
                                       f"messages.{i}.tool_calls") from None
                if not isinstance(args, dict):
                    raise APIError(400, f"messages[{i}].tool_calls: arguments must be a JSON object",
                                   f"messages.{i}.tool_calls")
                calls.append({"id": tc.id, "type": "function",
                              "function": {"name": tc.function.name, "arguments": args}})
            d["tool_calls"] = calls
        out.append(d)
    return out


CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _render(model, template, messages, tools, kwargs) -> tuple[list[int], str]:
    """Prompt ids of a conversation through `template` (the file's, or the ChatML fallback), rendered and
    encoded as Model.apply_chat_template does: the template's control tokens are tokens, a control token's
    text inside a message stays text. Also the prompt's last text, to see whether it opens <think>."""
    from .chat import ChatTemplateError

    try:
        text = template.render(messages, tools=tools, add_generation_prompt=True, mark=True, **kwargs)
        ids = template.encode(text)
    except ChatTemplateError as e:
        raise APIError(400, f"the chat template failed: {e}", "messages") from None
    return ids, model.tokenizer.decode(ids[-64:], skip_special=False)


# ---- the reply: text as it streams, stop strings, reasoning, tool calls ----


class _Reply:
    """Turns token ids as they become final into response pieces: ("content", text),
    ("reasoning", text), ("tool_call", call); `stopped` once a stop string appeared."""

    def __init__(self, model, *, stops: list[str], thinking: bool, tools, reasoning: bool):
        from .chat import ReasoningSplitter
        from .toolcalls import ToolCallStream

        self.thinking = thinking  # the prompt opened a <think> block
        self.content: list[str] = []  # what was given out, by kind (the non-streamed answer joins them)
        self.reasoning: list[str] = []
        self.text = model.tokenizer.stream()
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.stopped = False
        self.pending = ""  # text not yet checked against the stop strings' ends
        self.splitter = ReasoningSplitter(thinking) if reasoning else None
        self.tools = ToolCallStream(tools) if tools else None
        self.calls: list = []

    def feed(self, ids) -> list[tuple[str, object]]:
        if self.stopped:
            return []
        return self._keep(self._route(self._stop_check(self.text.add(ids), final=False)))

    def finish(self) -> list[tuple[str, object]]:
        out = []
        if not self.stopped:
            out = self._route(self._stop_check(self.text.finish(), final=True))
        if self.splitter is not None:
            out += self._route_parts(self.splitter.finish())
        if self.tools is not None:  # what the tool-call parser held back: text, or a last call
            for kind, v in self.tools.finish():
                if kind == "tool_call":
                    self.calls.append(v)
                out.append((kind, v))
        return self._keep(out)

    def _keep(self, pieces):
        for kind, v in pieces:
            if kind == "content":
                self.content.append(v)
            elif kind == "reasoning":
                self.reasoning.append(v)
        return [(k, v) for k, v in pieces if v != ""]

    def _stop_check(self, text: str, final: bool) -> str:
        if not self.stops:
            return text
        self.pending += text
        cut = min((i for i in (self.pending.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            out, self.pending, self.stopped = self.pending[:cut], "", True
        elif final:
            out, self.pending = self.pending, ""
        else:
            keep = min(self.hold, len(self.pending))
            # hold back only what may begin a stop string
            while keep and not any(s.startswith(self.pending[len(self.pending) - keep :]) for s in self.stops):
                keep -= 1
            out, self.pending = self.pending[: len(self.pending) - keep], self.pending[len(self.pending) - keep :]
        return out

    def _route(self, text: str) -> list[tuple[str, object]]:
        if not text:
            return []
        if self.splitter is None:
            return self._tool_parts([("content", text)]) if self.tools else [("content", text)]
        return self._route_parts(self.splitter.feed(text))

    def _route_parts(self, parts) -> list[tuple[str, object]]:
        out = []
        for kind, text in parts:
            if kind == "reasoning":
                out.append(("reasoning", text))
            elif self.tools is not None:
                out += self._tool_parts([("content", text)])
            else:
                out.append(("content", text))
        return out

    def _tool_parts(self, parts) -> list[tuple[str, object]]:
        out = []
        for kind, text in parts:
            if kind == "content" and self.tools is not None:
                for k, v in self.tools.feed(text):
                    out.append((k, v))
                    if k == "tool_call":
                        self.calls.append(v)
            elif kind == "tool_call":
                out.append((kind, text))
                self.calls.append(text)
            else:
                out.append((kind, text))
        return out


async def _respond(state: State, engine: Engine, request: Request, body: Sampling, prompt_ids, opts: Options,
                   reply: _Reply, *, chat: bool):
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    def emit(kind, payload):  # (the engine thread)
        loop.call_soon_threadsafe(queue.put_nowait, (kind, payload))

    job = Job(prompt_ids, opts, emit, want_steps=bool(body.show_steps), cache_prompt=body.cache_prompt)
    try:
        engine.submit(job)
    except QueueFull:
        raise APIError(429, "the server is busy (its queue is full); retry later", type_="rate_limit_error",
                       headers={"Retry-After": "1"}) from None
    except RuntimeError:
        raise APIError(503, "the server is shutting down", type_="unavailable_error") from None
    rid = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
    created = int(time.time())
    model_name = state.settings.alias

    waiting: list = []  # the pending queue.get(), kept across calls so that no event is lost
    gone: list = []  # the task that waits for the client's disconnect (created on the first watched wait)
    GONE = ("gone", None)

    async def client_gone() -> None:
        # The request body has been read whole, so the ASGI channel's next message is http.disconnect: the
        # server sends it when the connection closes (or once the response is complete, by then unwatched).
        try:
            while (await request.receive())["type"] != "http.disconnect":
                pass
        except Exception:  # (a channel that fails cannot deliver the reply either: the same as a disconnect)
            pass

    async def next_event(watch: bool):
        """The engine's next (kind, payload), None after its last; GONE when `watch` and the client has
        disconnected meanwhile (its job is cancelled then, before the engine's next forward). The disconnect
        is awaited beside the events, not polled between them: a model that emits tokens every forward
        would otherwise never leave time for the poll."""
        if not waiting:
            waiting.append(asyncio.ensure_future(queue.get()))
        if watch and not gone:
            gone.append(asyncio.ensure_future(client_gone()))
        done, _ = await asyncio.wait(waiting + (gone if watch else []), return_when=asyncio.FIRST_COMPLETED)
        if waiting[0] in done:
            kind, payload = waiting.pop().result()
            return None if kind == "end" else (kind, payload)
        job.cancel()
        return GONE

    def let_go():
        job.cancel()  # (no effect once the job has ended)
        for w in waiting + gone:
            w.cancel()

    generated = 0  # tokens given to the reply (the usage after a stop string, which ends the job early)
    tok = engine.model.tokenizer
    lp_entries: list = []  # with logprobs: per token given to the reply, its entry (OpenAI's chat form)
    lp_offsets: list = []  # ... and the reply's characters before it (completions' text_offset)
    lp_chars = codecs.getincrementaldecoder("utf-8")(errors="ignore")  # (a split character counts where it ends)
    lp_seen = 0  # characters of the entries so far
    lp_sent = 0  # (streamed: the entries already in a chunk)

    def lp_entry(t: int, lp: float, top) -> dict:
        def one(i, v):
            b = tok.token_bytes(i)
            return {"token": b.decode("utf-8", errors="replace"), "logprob": v, "bytes": list(b)}

        return {**one(t, lp), "top_logprobs": [one(i, v) for i, v in top]}

    def take_tokens(tokens, logprobs=None) -> list:
        nonlocal generated, lp_seen
        # with stop strings one token at a time, so that the reply (its usage, its logprobs) ends with the
        # token that completed a stop
        step = 1 if reply.stops else max(1, len(tokens))
        pieces = []
        for i in range(0, len(tokens), step):
            if reply.stopped:  # tokens the job made before it saw the stop: not part of the reply, not counted
                break
            part = tokens[i : i + step]
            generated += len(part)
            if logprobs is not None:
                for t, (lp, top) in zip(part, logprobs[i : i + step]):
                    lp_entries.append(lp_entry(t, lp, top))
                    lp_offsets.append(lp_seen)
                    lp_seen += len(lp_chars.decode(tok.token_bytes(t)))
            pieces += reply.feed(part)
            if reply.stopped:
                job.stop()
        return pieces

    def finish_reason(stats) -> str:
        if reply.calls:
            return "tool_calls"
        if reply.stopped:
            return "stop"
        return "length" if stats is not None and stats.generated_tokens >= opts.max_new_tokens else "stop"

    def usage(stats) -> dict:
        # after a stop string: the tokens up to the one that completed it, however far the job had gone
        n = generated if reply.stopped or stats is None else stats.generated_tokens
        return {"prompt_tokens": len(prompt_ids), "completion_tokens": n, "total_tokens": len(prompt_ids) + n,
                "prompt_tokens_details": {"cached_tokens": job.cached_tokens}}

    def logprobs_field(start: int = 0, end: int | None = None):
        """The choice's logprobs for entries start:end: chat's {"content": [...]}, or the completions form
        (tokens, token_logprobs, top_logprobs with the chosen token always among them, and text_offset: the
        characters of the reply before each token, a character split between tokens counted where it ends)."""
        entries = lp_entries[start:end]
        if opts.logprobs is None:
            return None
        if chat:
            return {"content": entries, "refusal": None}
        return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
                "top_logprobs": [{**{t["token"]: t["logprob"] for t in e["top_logprobs"]}, e["token"]: e["logprob"]}
                                 for e in entries] if opts.logprobs else [{} for _ in entries],
                "text_offset": lp_offsets[start:end]}

    def clover_stats(stats) -> dict:
        if stats is None:
            return {}
        d = stats.as_dict()
        return {k: d[k] for k in ("forwards", "tokens_per_forward", "tokens_per_second", "seconds", "prefill_seconds")}

    if not body.stream:
        stats, error = None, None
        try:
            while (ev := await next_event(watch=True)) is not None:
                if ev is GONE:
                    return JSONResponse(error_body("client disconnected"), status_code=499)
                kind, payload = ev
                if kind == "error":
                    error = payload
                elif payload.kind == "tokens":
                    take_tokens(payload.tokens, payload.logprobs)
                elif payload.kind == "done":
                    stats = payload.stats
        finally:
            let_go()
        if error is not None and stats is None:
            raise _engine_error(error)
        reply.finish()
        _record_ttft(state, job)
        if chat:
            msg: dict[str, Any] = {"role": "assistant"}
            content = "".join(reply.content)
            if reply.calls:
                content = content.strip()
            msg["content"] = content if (content or not reply.calls) else None
            if reply.thinking or reply.reasoning:
                msg["reasoning_content"] = "".join(reply.reasoning)
            if reply.calls:
                msg["tool_calls"] = reply.calls
            choice = {"index": 0, "message": msg, "finish_reason": finish_reason(stats),
                      "logprobs": logprobs_field()}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": "".join(reply.content), "finish_reason": finish_reason(stats),
                      "logprobs": logprobs_field()}
            obj = "text_completion"
        return {"id": rid, "object": obj, "created": created, "model": model_name, "choices": [choice],
                "usage": usage(stats), "clover": clover_stats(stats)}

    # streamed: wait for the first event first, so that a request the engine refuses still gets its 4xx
    try:
        first = await next_event(watch=True)
    except BaseException:
        let_go()
        raise
    if first is GONE or (first is not None and first[0] == "error"):
        let_go()
        if first is GONE:
            return JSONResponse(error_body("client disconnected"), status_code=499)
        raise _engine_error(first[1])
    for w in gone:  # (from here the streaming response watches the connection itself)
        w.cancel()
    gone.clear()
    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    def chunk(delta: dict | None = None, finish=None, text: str | None = None, extra: dict | None = None) -> str:
        nonlocal lp_sent
        lp = None
        if (delta is not None or text is not None) and opts.logprobs is not None and lp_sent < len(lp_entries):
            # a choice's chunk carries the entries of the tokens given since the last one that did (text a
            # stop string or a split character holds back does not hold back its tokens' entries)
            lp = logprobs_field(lp_sent)
            lp_sent = len(lp_entries)
        if chat:
            choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": lp}]
            obj = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model_name,
                   "choices": choices}
        else:
            choices = [] if text is None else [{"index": 0, "text": text, "finish_reason": finish, "logprobs": lp}]
            obj = {"id": rid, "object": "text_completion", "created": created, "model": model_name, "choices": choices}
        if extra:
            obj.update(extra)
        return "data: " + json.dumps(obj, ensure_ascii=False) + "\n\n"

    def pieces_to_chunks(pieces, progress: dict | None = None) -> list[str]:
        """Chunks of the reply's pieces; the first carries `clover_progress` (tokens and forwards so far, for
        live speed and tokens-per-forward displays such as the chat page's)."""
        out = []
        for kind, v in pieces:
            extra, progress = ({"clover_progress": progress} if progress else None), None
            if not chat:
                out.append(chunk(text=v, extra=extra))
            elif kind == "content":
                out.append(chunk({"content": v}, extra=extra))
            elif kind == "reasoning":
                out.append(chunk({"reasoning_content": v}, extra=extra))
            elif kind == "tool_call":
                index = next(i for i, c in enumerate(reply.calls) if c is v)
                out.append(chunk({"tool_calls": [{"index": index, **v}]}, extra=extra))
        return out

    mask = engine.model.config.mask_token_id

    def block_pieces(block) -> list:
        tok = engine.model.tokenizer
        return [None if t == mask else tok.decode([t]) for t in block]

    async def stream():
        stats = None
        try:
            if chat:
                yield chunk({"role": "assistant", "content": ""})
            ev = first
            while ev is not None:
                kind, payload = ev
                if kind == "error":  # (an error ends the stream: no finish_reason, no usage)
                    yield "data: " + json.dumps(error_body(str(payload), type_="server_error")) + "\n\n"
                    yield "data: [DONE]\n\n"
                    return
                if payload.kind == "tokens":
                    pieces = take_tokens(payload.tokens, payload.logprobs)
                    progress = {"completion_tokens": generated, "forwards": max(job.forwards, 1)}
                    for c in pieces_to_chunks(pieces, progress):
                        yield c
                elif payload.kind == "step" and body.show_steps:
                    yield chunk(None, extra={"clover_step": {"block": block_pieces(payload.block)}}) if chat else \
                        chunk(extra={"clover_step": {"block": block_pieces(payload.block)}})
                elif payload.kind == "done":
                    stats = payload.stats
                ev = await next_event(watch=False)  # (a disconnect cancels this generator: let_go)
            for c in pieces_to_chunks(reply.finish()):
                yield c
            _record_ttft(state, job)
            fr = finish_reason(stats)
            yield chunk({}, fr) if chat else chunk(text="", finish=fr)
            if include_usage:
                yield chunk(None, extra={"usage": usage(stats), "clover": clover_stats(stats)}) if chat else \
                    chunk(extra={"usage": usage(stats), "clover": clover_stats(stats)})
            yield "data: [DONE]\n\n"
        finally:
            let_go()

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _record_ttft(state: State, job: Job) -> None:
    if job.first_token_at is not None:
        state.ttft_sum += job.first_token_at - job.submitted
        state.ttft_n += 1


def _engine_error(e: BaseException) -> APIError:
    if isinstance(e, ValueError):  # the request's own options or prompt (a failed forward: ForwardFailed, a 500)
        return APIError(400, str(e))
    return APIError(500, f"generation failed: {type(e).__name__}: {e}", type_="server_error")


def _prometheus(state: State) -> str:
    e = state.engine
    m = e.metrics if e else None
    lines = []

    def metric(name, kind, help_, value):
        lines.extend([f"# HELP clover_{name} {help_}", f"# TYPE clover_{name} {kind}", f"clover_{name} {value}"])

    metric("http_requests_total", "counter", "HTTP requests received.", state.http_requests)
    if m is not None:
        metric("requests_total", "counter", "Generation requests admitted to the queue.", m.requests_total)
        metric("requests_rejected_total", "counter", "Requests refused with 429 (queue full).", m.rejected_total)
        metric("requests_failed_total", "counter", "Generation requests that failed.", m.requests_failed)
        metric("requests_cancelled_total", "counter", "Generations stopped early (client gone, stop string).",
               m.requests_cancelled)
        metric("prompt_tokens_total", "counter", "Prompt tokens received.", m.prompt_tokens_total)
        metric("prompt_tokens_cached_total", "counter", "Prompt tokens not read again: an earlier request's caches "
               "held them.", m.prompt_tokens_cached_total)
        metric("generated_tokens_total", "counter", "Tokens generated.", m.generated_tokens_total)
        metric("forwards_total", "counter", "Batched forwards run.", m.forwards_total)
        metric("sequence_forwards_total", "counter", "Per-sequence forwards (a batched forward counts each).",
               m.sequence_forwards_total)
        tpf = m.generated_tokens_total / m.sequence_forwards_total if m.sequence_forwards_total else 0.0
        metric("tokens_per_forward", "gauge", "Generated tokens per sequence forward, since start.", f"{tpf:.4f}")
        tps = m.generated_tokens_total / m.busy_seconds_total if m.busy_seconds_total else 0.0
        metric("tokens_per_second", "gauge", "Generated tokens per second of forward time, since start.", f"{tps:.3f}")
        metric("busy_seconds_total", "counter", "Seconds spent in forwards.", f"{m.busy_seconds_total:.3f}")
        metric("queue_depth", "gauge", "Requests waiting for a decoding slot.", e.queue_depth)
        metric("active_sequences", "gauge", "Sequences decoding now.", e.active)
        ttft = state.ttft_sum / state.ttft_n if state.ttft_n else 0.0
        metric("time_to_first_token_seconds_avg", "gauge", "Mean time from request to its first token.", f"{ttft:.4f}")
    return "\n".join(lines) + "\n"
