"""The process chat templates compile and render in (clover_cpu.chat._Worker starts it): a template that
computes for minutes inside one C call, or builds gigabytes, is stopped here by the parent's kill or by
this process's memory limit, and the caller gets one line. It reads length-prefixed pickles
(op, source, payload, time_limit) on stdin and answers (ok, value or message) on stdout; ops: compile,
render (payload: the template's variables), literals. It loads chat.py by path, so that it imports
nothing but the standard library and jinja2 (not the package, its C extension or numpy).

    python template_worker.py MEMORY_BYTES
"""

import importlib.util
import os
import pickle
import resource
import struct
import sys


def _load_chat():
    spec = importlib.util.spec_from_file_location("clover_chat", os.path.join(os.path.dirname(__file__), "chat.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _vm_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def main() -> int:
    chat = _load_chat()
    extra = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 30
    vm = _vm_bytes()
    # (Linux: where the limit is enforced and /proc tells the start; not under a sanitizer's runtime, which
    # reserves terabytes of address space at start and maps more as it goes)
    if 0 < vm < 1 << 40:
        resource.setrlimit(resource.RLIMIT_AS, (vm + extra, vm + extra))
    cache = {}  # source -> compiled template (the last few)
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    while True:
        head = inp.read(8)
        if len(head) < 8:
            return 0
        op, source, payload, time_limit = pickle.loads(inp.read(struct.unpack("<Q", head)[0]))
        try:
            if op == "literals":
                value = chat.template_literal_text(source)
            else:
                tpl = cache.get(source)
                if tpl is None:
                    tpl = chat.compile_template(source)
                    if len(cache) >= 8:
                        cache.pop(next(iter(cache)))
                    cache[source] = tpl
                value = chat.render_compiled(tpl, payload, time_limit) if op == "render" else None
            reply = (True, value)
        except chat.ChatTemplateError as e:
            reply = (False, str(e))
        except MemoryError:
            reply = (False, "the chat template ran out of memory")
        except Exception as e:  # anything else is still one line to the caller
            reply = (False, f"the chat template failed: {type(e).__name__}: {' '.join(str(e).split())[:300]}")
        data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        out.write(struct.pack("<Q", len(data)) + data)
        out.flush()


if __name__ == "__main__":
    sys.exit(main())
