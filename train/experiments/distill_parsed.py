"""Experiment (2026-12-03): self-distillation on filtered trajectories, for more tokens per forward
without the repetition loops that plain self-distillation (self_distill.py) taught the model.

Continues a finished run of train_clover.py (its OUT/ckpt.pt and OUT/clover-small.gguf). Prompts are the
headers of functions without a docstring in the *training* files (every candidate, not only the middle
one; eval_prompts() draws from the held-out files), each with the 192 tokens of its file that end at the
header. The runtime decodes 64 tokens greedily at threshold 0.9; a trajectory is kept only when
prompt + completion parses (train_clover.parses), contains no EOS and repeats no 4-gram of tokens three
times. Fine-tuning then mixes 8 ordinary diffusion sequences with 8 kept trajectories per step (masks
only on the generated tokens), cross-entropy plus BETA x the entropy of the masked positions of the
trajectories the model already gets right ("certainty forcing", as in dParallel). Exports, converts and
runs train_clover's --eval metrics on the result.

    python train/experiments/distill_parsed.py SRC_OUT EXP_OUT N_PROMPTS MINUTES BETA LR

Result (2026-12-03, the shipped model): 4 of 400 trajectories pass the filters (389 loop), so the
fine-tuning was never run; see train/README.md. The script stops when fewer than 64 are kept.
"""
import ast, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import numpy as np
import train_clover as tc
from distill_common import finetune_and_evaluate, log, setup
SRC, OUT, N_PROMPTS, MINUTES, BETA, LR, model, saved, tokens = setup()
shape = model.shape
sp = tc.load_sp((SRC / 'hf' / 'tokenizer.model').read_bytes())
B = shape.block_length
P, G = 192, 64


def candidates():
    """(header text, 192 context token ids ending with the header) over the training files."""
    fn = (ast.FunctionDef, ast.AsyncFunctionDef)
    out = []
    for _, text in tc.read_corpus()['train']:
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        lines = text.splitlines(keepends=True)
        nodes = []
        for node in tree.body:
            if isinstance(node, fn):
                nodes.append((None, node))
            elif isinstance(node, ast.ClassDef):
                nodes += [(node, it) for it in node.body if isinstance(it, fn)]
        for cls, node in nodes:
            if tc._has_docstring(node):
                continue
            header = tc._header(lines, node)
            if cls is not None:  # what parses is the class line + the method's header
                header = lines[cls.lineno - 1] + header
                if not lines[cls.lineno - 1].rstrip().endswith(':'):
                    continue
            if not header.rstrip().endswith(':'):
                continue
            j = node.body[0].lineno - 1
            k, chars = j, 0
            while k > 0 and chars < 8 * P:  # ~2.5 characters per token: enough lines for P tokens
                k -= 1
                chars += len(lines[k])
            ctx = sp.encode(''.join(lines[k:j]))
            if len(ctx) >= P:
                out.append((header, ctx[-P:]))
    return out


def loops(ids, n=4, k=3):
    seen = {}
    for i in range(len(ids) - n + 1):
        g = tuple(ids[i:i + n]); seen[g] = seen.get(g, 0) + 1
        if seen[g] >= k:
            return True
    return False


gen_path = OUT / 'gen.npy'
if gen_path.exists():
    data = np.load(gen_path)
else:
    import clover_cpu
    m = clover_cpu.load(SRC / 'clover-small.gguf', threads=2)
    cands = candidates()
    rng = np.random.default_rng(321)
    order = rng.permutation(len(cands))[:N_PROMPTS]
    log(f'{len(cands)} candidate prompts, decoding {len(order)}')
    rows, n_parse, n_loop, n_eos, fw = [], 0, 0, 0, 0
    t = time.time()
    for i, c in enumerate(order):
        header, ctx = cands[c]
        out = []
        for ev in m.generate(ctx, max_new_tokens=G, threshold=0.9, stop_at_eos=False):
            out += ev.tokens; fw += 1
        out = out[:G]
        ok_parse = tc.parses(header, sp.decode(out))
        has_loop = loops(out)
        has_eos = tc.EOS_ID in out
        n_parse += ok_parse; n_loop += has_loop; n_eos += has_eos
        if ok_parse and not has_loop and not has_eos:
            rows.append(list(ctx) + out)
        if i % 200 == 0:
            log(f'gen {i} kept {len(rows)} {time.time()-t:.0f}s')
    log(f'kept {len(rows)} of {len(order)}: parse {n_parse}, loops {n_loop}, eos {n_eos}; '
        f'{len(order) * G / max(1, fw):.2f} tokens/forward while generating')
    if len(rows) < 64:
        sys.exit(f'only {len(rows)} trajectories pass the filters: nothing to distil')
    data = np.array(rows, np.int64)
    np.save(gen_path, data)
log(f'gen data {data.shape}')
finetune_and_evaluate(model, saved, tokens, data, P, G, SRC, OUT, MINUTES, BETA, LR, log)
