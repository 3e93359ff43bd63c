"""Chat templates: a GGUF's `tokenizer.chat_template` rendered as transformers renders it, in a sandbox.

A model file is written by a stranger, and its template is code. It runs in Jinja's
ImmutableSandboxedEnvironment (no attribute starting with `_`, no unsafe methods, no mutation of the
inputs), with transformers' settings (trim_blocks, lstrip_blocks, loopcontrols, its `tojson`,
`raise_exception`, `strftime_now`, default Undefined), so the Qwen family's templates render byte for byte
as `transformers.utils.chat_template_utils.render_jinja_template` renders them. The template compiles and
renders in a process of its own (template_worker.py) with a memory limit (RLIMIT_AS), killed when it runs
past its time limit: a filter working for minutes inside one C call, or a structure of gigabytes, stops there
and nowhere else. Inside it the sandbox also bounds what it can: the time limit checked on every template
line, sequences built by `*`, `+`, `~` and `%`, powers, and the numbers given to filters capped, deep
recursion caught. Every failure is a ChatTemplateError: one line, no traceback.

Control tokens a user types (`<|im_end|>` in a message) are text, not tokens, when the chat is tokenized
with `sanitize=True` (the default of `Model.apply_chat_template(..., tokenize=True)`): the inputs' control
tokens are wrapped in private-use markers before rendering, and the marked spans are encoded without any
added token (transformers' `sanitize_control_tokens=True` does the same, with the same markers).
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.compiler
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

# transformers' markers for control tokens found in user input (chat_template_utils._CONTROL_TOKEN_START/END)
MARK_START, MARK_END = "\U000f0000", "\U000f0001"
TIME_LIMIT = 10.0  # seconds a render may take (the Qwen3.5 template renders 100 turns in ~10 ms)
MAX_SEQUENCE = 1 << 22  # elements of a string or list an operator, filter or call makes (4M characters)
MAX_NUMBER = 1 << 16  # an integer given to a filter, a call or an operator (a width, a count, a repeat)
MAX_WORK = 1 << 28  # the largest operand's size times the next factor, before a call (see _preflight)
MAX_OUTPUT = 1 << 26  # characters a render may produce (64M)
WORKER_MEMORY = 1 << 30  # bytes of address space the template process may add to what it starts with
WORKER_GRACE = 2.0  # seconds past the time limit before the template process is killed
# message fields transformers copies a message's reasoning from, the first being the one templates read
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(ValueError):
    """The chat template cannot be compiled or rendered; the message is one line."""


class _Timeout(Exception):
    pass


class _Generation(jinja2.ext.Extension):
    """transformers' `{% generation %}...{% endgeneration %}` (it marks the assistant's text for training
    masks); it renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


class _TemplateDict:
    """`dict(...)` for templates, without the class itself (whose attributes lead out of the sandbox)."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """`namespace(...)` that refuses attribute names starting with `_` (as transformers' does)."""

    def __init__(*args, **kwargs):  # noqa: N805 (Jinja's signature trick, so that namespace(self=...) works)
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a namespace attribute cannot start with '_' ({name!r})")


def _sized(x) -> int:
    return len(x) if isinstance(x, (str, bytes, list, tuple, dict)) else 0


# a width or precision in a %-format or a {}-format spec: '%1000000000s', '{:>1000000000}'
_FORMAT_NUMBERS = re.compile(r"%[-#0 +]*(\d*)(?:\.(\d+))?|\{[^{}]*?:[^{}]*?(\d+)")


def _check_format(fmt, what: str) -> None:
    if isinstance(fmt, str):
        for m in _FORMAT_NUMBERS.finditer(fmt):
            for d in m.groups():
                if d and int(d) > MAX_NUMBER:
                    raise jinja2.exceptions.SecurityError(
                        f"{what}: a format width of {d} passes the limit {MAX_NUMBER}"
                    )


def _preflight(what: str, values, kwargs=None) -> None:
    """Refuse a call or operator whose result could be huge before it runs: integers (widths, counts)
    at most MAX_NUMBER, and the largest operand's size times the next factor (another operand's size or
    an integer) at most MAX_WORK (a `join` with a long separator, a `replace` with a long replacement,
    an `indent` of many lines)."""
    values = list(values) + list((kwargs or {}).values())
    factors = []
    for v in values:
        if isinstance(v, int) and not isinstance(v, bool):
            if abs(v) > MAX_NUMBER:
                raise jinja2.exceptions.SecurityError(
                    f"{what} was given {v}, more than the limit {MAX_NUMBER}"
                )
            factors.append(abs(v))
        else:
            factors.append(_sized(v))
    factors.sort(reverse=True)
    if len(factors) >= 2 and factors[0] * max(1, factors[1]) > MAX_WORK:
        raise jinja2.exceptions.SecurityError(
            f"{what} on operands of {factors[0]} and {factors[1]} elements passes the limit {MAX_WORK}"
        )


def _postcheck(what: str, result):
    if _sized(result) > MAX_SEQUENCE:
        raise jinja2.exceptions.SecurityError(
            f"{what} made {_sized(result)} elements, more than the limit {MAX_SEQUENCE}"
        )
    return result


def _guard(name: str, fn):
    """A filter or global whose arguments and result are bounded (a `center(10**9)` would allocate
    gigabytes)."""
    skip = 1 if hasattr(fn, "jinja_pass_arg") else 0  # the context / eval context / environment

    def guarded(*args, **kwargs):
        if name == "format" and len(args) > skip:
            _check_format(args[skip], name)
        _preflight(name, args[skip:], kwargs)
        return _postcheck(name, fn(*args, **kwargs))

    if hasattr(fn, "jinja_pass_arg"):
        guarded.jinja_pass_arg = fn.jinja_pass_arg
    guarded.__name__ = getattr(fn, "__name__", name)
    return guarded


class _CodeGenerator(jinja2.compiler.CodeGenerator):
    """`a ~ b` through the environment, so that string building by concatenation is bounded too."""

    def visit_Concat(self, node, frame):
        if frame.eval_ctx.volatile or frame.eval_ctx.autoescape:
            return super().visit_Concat(node, frame)
        self.write("environment.concat_checked((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _Environment(ImmutableSandboxedEnvironment):
    code_generator_class = _CodeGenerator
    intercepted_binops = frozenset(["*", "+", "**", "%"])

    def call_binop(self, context, operator, left, right):
        what = f"the operator {operator}"
        if operator == "**":
            if (
                isinstance(left, int)
                and isinstance(right, int)
                and abs(left) > 1
                and right * max(1, abs(left).bit_length()) > MAX_NUMBER
            ):
                raise jinja2.exceptions.SecurityError(f"{left} ** {right} is too large")
        elif operator == "%":
            _check_format(left, what)
            _preflight(what, [left, *(right if isinstance(right, tuple) else (right,))])
        else:
            _preflight(what, [left, right])
        return _postcheck(what, super().call_binop(context, operator, left, right))

    def concat_checked(self, parts):
        total = 0
        out = []
        for p in parts:
            p = str(p)
            total += len(p)
            if total > MAX_SEQUENCE:
                raise jinja2.exceptions.SecurityError(
                    f"the operator ~ made more than {MAX_SEQUENCE} characters"
                )
            out.append(p)
        return "".join(out)

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (Jinja's signature)
        what = getattr(__obj, "__name__", "a call")
        _preflight(what, [getattr(__obj, "__self__", None), *args], kwargs)
        return _postcheck(what, super().call(__context, __obj, *args, **kwargs))

    def wrap_str_format(self, value):
        wrapped = super().wrap_str_format(value)
        if wrapped is not None:
            _check_format(getattr(value, "__self__", None), "format")
        return wrapped


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' tojson: no key sorting and no HTML escaping (Jinja's own does both)
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


def _environment() -> _Environment:
    env = _Environment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    for name, fn in list(env.filters.items()):
        env.filters[name] = _guard(name, fn)
    env.globals.pop("lipsum", None)  # lorem ipsum of any length: nothing a chat needs
    env.globals.update(
        raise_exception=_raise_exception,
        strftime_now=_guard("strftime_now", _strftime_now),
        dict=_TemplateDict(),
        namespace=_Namespace,
    )
    return env


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text[:300] + ("..." if len(text) > 300 else "")


def _template_line(tb) -> int | None:
    """The template line a traceback passed through last (Jinja rewrites its frames to template lines)."""
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def plain_data(value):
    """What a template may see: JSON-like values rebuilt from plain types (transformers'
    _plain_template_data), so no object with methods of its own reaches the sandbox."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain_data(k): plain_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_data(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain_data(v) for v in value)
    if hasattr(value, "item") and callable(value.item) and getattr(value, "shape", None) == ():
        return plain_data(value.item())  # a numpy scalar
    return f"<{type(value).__name__}>"


def _alias_reasoning(messages: list) -> list:
    """Each message's reasoning under every name templates read it by (transformers'
    _alias_reasoning_fields)."""
    out = []
    for m in messages:
        if isinstance(m, dict):
            r = next((m[k] for k in _REASONING_FIELDS if m.get(k) is not None), None)
            if r is not None:
                m = {"thinking": r, **m, "reasoning_content": r}
        out.append(m)
    return out


def template_literal_text(source: str) -> str:
    """The template's raw text and string constants, joined by NULs (what transformers searches for the
    added tokens that a template writes)."""
    env = _environment()
    ast = env.parse(source)
    lits = {n.data for n in ast.find_all(jinja2.nodes.TemplateData)}
    lits |= {n.value for n in ast.find_all(jinja2.nodes.Const) if isinstance(n.value, str)}
    return "\0".join(lits)


def compile_template(source: str):
    """The sandboxed jinja2 Template, or a ChatTemplateError saying why not."""
    if not isinstance(source, str):
        raise ChatTemplateError("the chat template is not a string")
    try:
        return _environment().from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"the chat template cannot be parsed: line {e.lineno}: {_one_line(e)}") from None
    except Exception as e:  # the compiler's own limits too (SyntaxError: too many nested blocks), MemoryError
        raise ChatTemplateError(f"the chat template cannot be compiled: {type(e).__name__}: {_one_line(e)}") from None


def render_compiled(template, context: dict, time_limit: float) -> str:
    """Render in this process, under the sandbox's limits and a line tracer that stops at time_limit."""
    deadline = time.monotonic() + time_limit

    def trace_lines(frame, event, arg):
        if time.monotonic() > deadline:
            raise _Timeout
        return trace_lines

    def trace_calls(frame, event, arg):
        # only the template's own code is traced line by line (its loops and macros); filters and Python's
        # own functions run untraced (the process's time limit stops those)
        return trace_lines if frame.f_code.co_filename == "<template>" else None

    previous = sys.gettrace()
    sys.settrace(trace_calls)
    try:
        out, n = [], 0
        for piece in template.generate(**context):
            n += len(piece)
            if n > MAX_OUTPUT:
                raise ChatTemplateError(f"the chat template's output passed {MAX_OUTPUT} characters")
            out.append(piece)
        return "".join(out)
    except ChatTemplateError:
        raise
    except _Timeout:
        raise ChatTemplateError(
            f"the chat template ran for more than {time_limit:g} s (an endless or enormous loop?)") from None
    except RecursionError:
        raise ChatTemplateError("the chat template recursed too deeply") from None
    except MemoryError:
        raise ChatTemplateError("the chat template ran out of memory") from None
    except jinja2.exceptions.SecurityError as e:
        raise ChatTemplateError(f"the chat template did something unsafe, refused: {_one_line(e)}") from None
    except Exception as e:  # TemplateError (raise_exception, undefined), or a Python error inside a filter
        line = _template_line(e.__traceback__)
        where = f" (line {line})" if line else ""
        kind = "" if isinstance(e, jinja2.TemplateError) else f"{type(e).__name__}: "
        raise ChatTemplateError(f"the chat template failed{where}: {kind}{_one_line(e)}") from None
    finally:
        sys.settrace(previous)


class _Worker:
    """The template process (template_worker.py), shared by every ChatTemplate of this process; one request
    at a time. Requests and replies are length-prefixed pickles on its stdin / stdout."""

    _lock = threading.Lock()
    _proc = None

    @classmethod
    def call(cls, op: str, source: str, payload, time_limit: float):
        import pickle
        import struct
        import subprocess

        with cls._lock:
            if cls._proc is None or cls._proc.poll() is not None:
                worker = Path(__file__).with_name("template_worker.py")
                cls._proc = subprocess.Popen([sys.executable, str(worker), str(WORKER_MEMORY)], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            proc = cls._proc
            data = pickle.dumps((op, source, payload, time_limit), protocol=pickle.HIGHEST_PROTOCOL)
            try:
                proc.stdin.write(struct.pack("<Q", len(data)) + data)
                proc.stdin.flush()
                # the worker stops itself at time_limit on template lines; a C call that runs on is killed here
                head = _read_exactly(proc.stdout.fileno(), 8, time.monotonic() + time_limit + WORKER_GRACE)
                reply = pickle.loads(_read_exactly(proc.stdout.fileno(), struct.unpack("<Q", head)[0],
                                                   time.monotonic() + WORKER_GRACE))
            except _Timeout:
                cls._kill()
                raise ChatTemplateError(f"the chat template ran for more than {time_limit:g} s (stopped)") from None
            except (OSError, EOFError, pickle.UnpicklingError, struct.error):
                cls._kill()
                raise ChatTemplateError("the chat template's renderer stopped (it ran out of its "
                                        f"{WORKER_MEMORY >> 20} MiB of memory, or crashed)") from None
        ok, value = reply
        if not ok:
            raise ChatTemplateError(value)
        return value

    @classmethod
    def _kill(cls):
        if cls._proc is not None:
            try:
                cls._proc.kill()
                cls._proc.wait(timeout=5)
            except Exception:
                pass
            cls._proc = None


def _read_exactly(fd: int, n: int, deadline: float) -> bytes:
    import select

    out = bytearray()
    while len(out) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise _Timeout
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            raise _Timeout
        chunk = os.read(fd, n - len(out))
        if not chunk:
            raise EOFError
        out += chunk
    return bytes(out)


class ChatTemplate:
    """A chat template. render() gives the text; with a tokenizer, encode() gives the ids of a rendering made
    with mark=True, control tokens from the inputs encoded as text. isolate=False compiles and renders in
    this process (the fuzzer, and the template process itself, do)."""

    def __init__(self, source: str, *, tokenizer=None, special_tokens: dict | None = None,
                 time_limit: float = TIME_LIMIT, isolate: bool = True):
        if not isinstance(source, str):
            raise ChatTemplateError("the chat template is not a string")
        self.source = source
        self.time_limit = time_limit
        self.special_tokens = dict(special_tokens or {})
        self.tokenizer = tokenizer
        self.isolate = isolate
        self._control_re = None
        if isolate:
            _Worker.call("compile", source, None, time_limit)  # refuse a template that does not compile, now
        else:
            self._template = compile_template(source)

    # -- rendering --

    def render(self, messages, *, tools=None, documents=None, add_generation_prompt: bool = False,
               mark: bool = False, **kwargs) -> str:
        """The template's text for `messages` (a list of {"role", "content", ...} dicts). `tools` (JSON
        schemas, OpenAI style), `documents`, `add_generation_prompt` and any other keyword (e.g.
        enable_thinking) reach the template as transformers passes them; bos_token / eos_token come from
        the file. mark=True wraps the control tokens found in the inputs in markers, for encode()."""
        if not isinstance(messages, (list, tuple)) or not all(isinstance(m, Mapping) for m in messages):
            raise ChatTemplateError("messages must be a list of objects with a role and a content")
        if tools is not None and not isinstance(tools, (list, tuple)):
            raise ChatTemplateError("tools must be a list of JSON schemas")
        if documents is not None and not (
            isinstance(documents, (list, tuple)) and all(isinstance(d, Mapping) for d in documents)
        ):
            raise ChatTemplateError("documents must be a list of objects")
        try:
            messages = _alias_reasoning(plain_data(list(messages)))
            tools, documents, kwargs = plain_data(tools), plain_data(documents), plain_data(kwargs)
            if mark:
                messages, tools, documents, kwargs = (self._mark(x) for x in (messages, tools, documents, kwargs))
        except ChatTemplateError:
            raise
        except RecursionError:
            raise ChatTemplateError("the messages are nested too deeply") from None
        except Exception as e:  # a Mapping whose items() raises, a value that will not convert
            raise ChatTemplateError(f"the messages cannot be read: {type(e).__name__}: {_one_line(e)}") from None
        context = {**self.special_tokens, **kwargs, "messages": messages, "tools": tools, "documents": documents,
                   "add_generation_prompt": bool(add_generation_prompt)}
        if self.isolate:
            return _Worker.call("render", self.source, context, self.time_limit)
        return render_compiled(self._template, context, self.time_limit)

    # -- control tokens in user input --

    def control_tokens(self) -> tuple[str, ...]:
        """The tokens that user input must not produce: the vocabulary's control tokens, and its
        user-defined tokens that the template writes itself (transformers' default rule)."""
        tok = self.tokenizer
        if tok is None:
            return ()
        if self.isolate:
            literal = _Worker.call("literals", self.source, None, self.time_limit)
        else:
            literal = template_literal_text(self.source)
        user = [
            t
            for t in tok.added_tokens()
            if t not in tok.control_tokens() and t in literal and not t.isspace()
        ]
        return tuple(tok.control_tokens()) + tuple(user)

    def _mark(self, obj):
        if self._control_re is None:
            tokens = sorted(self.control_tokens(), key=len, reverse=True)
            self._control_re = re.compile("|".join(map(re.escape, tokens)) or "(?!)")
            self._markers_re = re.compile(
                f"{MARK_START}({self._control_re.pattern}){MARK_END}|[{MARK_START}{MARK_END}]"
            )
        if isinstance(obj, str):
            obj = obj.replace(MARK_START, "").replace(MARK_END, "")  # no forged markers
            return self._control_re.sub(f"{MARK_START}\\g<0>{MARK_END}", obj)
        if isinstance(obj, dict):
            return {k: self._mark(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [self._mark(v) for v in obj]
        return obj

    def encode(self, marked: str) -> list[int]:
        """Token ids of a rendering made with mark=True: the template's own text with control tokens
        parsed, each marked span as plain text, lone markers dropped (they still split the text, so no
        control token forms across them). transformers' encode_marked_chat, piece for piece."""
        tok = self.tokenizer
        if self._control_re is None:
            self._mark("")
        pieces = self._markers_re.split(marked)
        newline = tok.encode("\n")
        ids = tok.encode(pieces[0])
        for i, piece in enumerate(pieces[1:], start=1):
            if not piece:
                continue
            as_text = i % 2 == 1
            enc = tok.encode_plain if as_text else tok.encode
            # encoded after a newline, so a SentencePiece model adds no prefix space mid-chat
            piece_ids = enc("\n" + piece)
            piece_ids = piece_ids[len(newline) :] if piece_ids[: len(newline)] == newline else enc(piece)
            if as_text and tok.token_to_id(piece) in piece_ids:
                raise ChatTemplateError(
                    f"cannot keep {piece!r} as text: the vocabulary makes that token from text"
                )
            ids += piece_ids
        return ids

    def user_turn_ids(self) -> list[int] | None:
        """The token ids that open a user message (Qwen3.5's template: `<|im_start|>user\n`; Llama 3's:
        `<|start_header_id|>user<|end_header_id|>\n\n`), from the rendering of a one-message conversation:
        the text from a control token up to the message's content, the last control token before it, or
        the one before that where only the role's name lies between them (so that the opener is not also
        what opens a system message). None where no control token comes before the content (no way to
        tell the template's own text from a message's). The prefill checkpoints a conversation where its
        first user message begins (clover_cpu.decode), as llama-server checkpoints at user messages, so that
        another conversation with the same system prompt and tools starts from there."""
        probe = "\U000f0002"  # (a private-use character no template writes)
        text = self.render([{"role": "user", "content": probe}], add_generation_prompt=False, mark=True)
        at = text.find(probe)
        controls = self.control_tokens()

        def last_control(end):
            return max((text.rfind(t, 0, end) for t in controls), default=-1) if end > 0 else -1

        start = last_control(at)
        if start < 0:
            return None
        before = last_control(start)
        if "user" not in text[start:at] and before >= 0:
            between = text[before:start]
            for t in controls:
                between = between.replace(t, "")
            if between.strip() == "user":
                start = before
        return self.encode(text[start:at]) or None

    @staticmethod
    def unmark(text: str) -> str:
        return text.replace(MARK_START, "").replace(MARK_END, "")


# -- reasoning (<think> ... </think>) --

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def opens_thinking(prompt_text: str) -> bool:
    """Whether the prompt ends inside a <think> block (a template that starts the model's reasoning)."""
    return prompt_text.rfind(THINK_OPEN) > prompt_text.rfind(THINK_CLOSE)


def split_reasoning(text: str, thinking: bool) -> tuple[str | None, str]:
    """(reasoning, answer) of a model's output; `thinking`: the prompt opened a <think> block. A reply that
    starts with <think> opens one itself. Reasoning not closed by the end is all reasoning."""
    stripped = text.lstrip()
    if not thinking and stripped.startswith(THINK_OPEN):
        thinking, text = True, stripped[len(THINK_OPEN) :]
    elif thinking and text.lstrip("\n").startswith(THINK_OPEN):  # a model may repeat the <think> its prompt opened
        text = text.lstrip("\n")[len(THINK_OPEN) :]
    if not thinking:
        return None, text
    head, sep, tail = text.partition(THINK_CLOSE)
    if not sep:
        return head.strip("\n"), ""
    return head.strip("\n"), tail.lstrip("\n")


class ReasoningSplitter:
    """Splits streamed text into ("reasoning", text) and ("content", text) parts as it arrives, holding
    back what may be the start of a <think> or </think> tag. `thinking`: the prompt opened a <think>
    block. Newlines right after <think> and </think> are dropped, as split_reasoning drops them."""

    def __init__(self, thinking: bool):
        self.state = "open" if thinking else "start"
        self.buf = ""
        self.repeated = False  # a <think> already seen (from the reply itself: no second one is dropped)

    def feed(self, text: str) -> list[tuple[str, str]]:
        self.buf += text
        out: list[tuple[str, str]] = []
        while True:
            if self.state == "start":  # before anything but whitespace: a reply may open <think> itself
                s = self.buf.lstrip()
                if s.startswith(THINK_OPEN):
                    self.buf, self.state, self.repeated = s[len(THINK_OPEN) :], "open", True
                    continue
                if THINK_OPEN.startswith(s):
                    return out
                self.state = "content"
            elif self.state == "open":  # newlines opening the reasoning (and a repeated <think>)
                s = self.buf.lstrip("\n")
                if not s:
                    self.buf = ""
                    return out
                if not self.repeated and s.startswith(THINK_OPEN):
                    self.buf, self.repeated = s[len(THINK_OPEN) :], True
                    continue
                if not self.repeated and THINK_OPEN.startswith(s):
                    self.buf = s
                    return out
                self.buf, self.state = s, "reasoning"
            elif self.state == "reasoning":
                i = self.buf.find(THINK_CLOSE)
                if i >= 0:
                    out.append(("reasoning", self.buf[:i].rstrip("\n")))
                    self.buf, self.state = self.buf[i + len(THINK_CLOSE) :], "after"
                    continue
                keep = next(
                    (
                        k
                        for k in range(min(len(self.buf), len(THINK_CLOSE) - 1), 0, -1)
                        if THINK_CLOSE.startswith(self.buf[-k:])
                    ),
                    0,
                )
                # trailing newlines wait too: they belong to the answer's separation if </think> follows
                body = self.buf[: len(self.buf) - keep]
                hold = len(body) - len(body.rstrip("\n"))
                emit = body[: len(body) - hold]
                if emit:
                    out.append(("reasoning", emit))
                self.buf = self.buf[len(emit) :]
                return out
            elif self.state == "after":  # newlines between </think> and the answer
                s = self.buf.lstrip("\n")
                if not s:
                    self.buf = ""
                    return out
                self.buf, self.state = s, "content"
            else:
                if self.buf:
                    out.append(("content", self.buf))
                self.buf = ""
                return out

    def finish(self) -> list[tuple[str, str]]:
        """What is held back, at the end of the output."""
        rest, self.buf = self.buf, ""
        if not rest:
            return []
        if self.state in ("open", "reasoning"):
            rest = rest.rstrip("\n")
            return [("reasoning", rest)] if rest else []
        if self.state == "after":
            return []
        return [("content", rest)]
