"""Tool calls in a model's reply, in the format of Qwen3.5's chat template (which Clover inherits; the
Qwen3-Coder XML format):

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    value
    </parameter>
    </function>
    </tool_call>

parsed into OpenAI `tool_calls` ({"id", "type": "function", "function": {"name", "arguments"}}, the
arguments a JSON object text), while it streams (ToolCallStream; a whole reply is one feed and finish).
A parameter's value is converted by the type the tool's JSON schema gives it (integer, number, boolean,
object, array, null), as vLLM's and llama.cpp's Qwen3-Coder parsers do; without a schema type, a value
that reads as JSON is taken as JSON, otherwise as a string.
"""

from __future__ import annotations

import json
import re
import secrets

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|$)", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|$)", re.S)


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def _param_types(tools) -> dict:
    """{function name: {parameter: JSON schema type}} from OpenAI-style tool definitions."""
    out: dict = {}
    for t in tools or []:
        fn = t.get("function", t) if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            continue
        params = fn.get("parameters")
        props = params.get("properties") if isinstance(params, dict) else None
        types = {}
        if isinstance(props, dict):
            for k, v in props.items():
                if isinstance(v, dict):
                    ty = v.get("type")
                    types[k] = ty if isinstance(ty, str) else (ty[0] if isinstance(ty, list) and ty else None)
        out[fn["name"]] = types
    return out


def _convert(value: str, ty: str | None):
    # the template writes a value on its own lines: one newline after <parameter=...> and before </parameter>
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    if ty == "string":
        return value
    s = value.strip()
    if ty == "integer":
        try:
            return int(s)
        except ValueError:
            return value
    if ty == "number":
        try:
            f = float(s)
            return int(f) if f.is_integer() and "." not in s and "e" not in s.lower() else f
        except ValueError:
            return value
    if ty == "boolean":
        return {"true": True, "false": False}.get(s.lower(), value)
    if ty == "null" and s.lower() in ("null", "none"):
        return None
    if ty in ("object", "array") or ty is None:
        try:
            return json.loads(s)
        except ValueError:
            return value
    return value


def parse_call(body: str, types: dict) -> dict | None:
    """One <tool_call> block's inside as an OpenAI tool call, or None when it names no function."""
    m = _FUNCTION.search(body)
    if not m:
        return None
    name = m.group(1).strip()
    ptypes = types.get(name, {})
    args = {}
    for pm in _PARAMETER.finditer(m.group(2)):
        key = pm.group(1).strip()
        args[key] = _convert(pm.group(2), ptypes.get(key))
    return {"id": new_call_id(), "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}


class ToolCallStream:
    """Streamed reply text in, ("content", text) and ("tool_call", call) parts out: text before a
    <tool_call> passes through (held back only while it may be the start of the tag); a call is given
    whole once its </tool_call> arrives. finish() flushes what is left (an unclosed call is parsed as far
    as it goes; a body that is no call stays text)."""

    def __init__(self, tools=None):
        self.types = _param_types(tools)
        self.buf = ""
        self.in_call = False
        self.calls = 0

    def feed(self, text: str) -> list[tuple[str, object]]:
        self.buf += text
        out: list[tuple[str, object]] = []
        while True:
            if self.in_call:
                j = self.buf.find(CLOSE)
                if j < 0:
                    return out
                call = parse_call(self.buf[:j], self.types)
                if call is not None:
                    out.append(("tool_call", call))
                    self.calls += 1
                else:
                    out.append(("content", OPEN + self.buf[: j + len(CLOSE)]))
                self.buf, self.in_call = self.buf[j + len(CLOSE) :], False
                continue
            i = self.buf.find(OPEN)
            if i >= 0:
                head = self.buf[:i]
                if head and not (self.calls and not head.strip()):
                    out.append(("content", head))
                self.buf, self.in_call = self.buf[i + len(OPEN) :], True
                continue
            # hold back what may be the start of <tool_call>
            keep = next((k for k in range(min(len(self.buf), len(OPEN) - 1), 0, -1)
                         if OPEN.startswith(self.buf[-k:])), 0)
            emit = self.buf[: len(self.buf) - keep]
            if emit and not (self.calls and not emit.strip()):
                out.append(("content", emit))
            self.buf = self.buf[len(emit) :]
            return out

    def finish(self) -> list[tuple[str, object]]:
        out: list[tuple[str, object]] = []
        if self.in_call:
            call = parse_call(self.buf, self.types)
            out.append(("tool_call", call) if call is not None else ("content", OPEN + self.buf))
        elif self.buf and not (self.calls and not self.buf.strip()):
            out.append(("content", self.buf))
        self.buf, self.in_call = "", False
        return out
