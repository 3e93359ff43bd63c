"""Experiment (session 7): self-distillation on filtered trajectories, for more tokens per forward
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

Result (session 7, the shipped model): 4 of 400 trajectories pass the filters (389 loop), so the
fine-tuning was never run; see train/README.md. The script stops when fewer than 64 are kept.
"""
import ast, sys, time, json, math, os
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import numpy as np, torch, torch.nn.functional as F
import train_clover as tc
torch.set_num_threads(2)
SRC = Path(sys.argv[1])
OUT = Path(sys.argv[2]); OUT.mkdir(exist_ok=True, parents=True)
N_PROMPTS = int(sys.argv[3]); MINUTES = float(sys.argv[4]); BETA = float(sys.argv[5]); LR = float(sys.argv[6])
log = lambda s: print(time.strftime('%H:%M:%S'), s, flush=True)
saved = torch.load(SRC / 'ckpt.pt', map_location='cpu', weights_only=False)
shape = tc.Shape(**saved['shape'])
model = tc.Clover(shape); model.load_state_dict(saved['model'])
tokens = np.load(SRC / 'train_tokens.npy')
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
            k = j
            while k > 0 and sum(map(len, lines[k:j])) < 8 * P:  # ~2.5 characters per token
                k -= 1
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
r = tc.Recipe(precision='bf16' if tc.cpu_has_bf16() else 'fp32')
opt = tc.make_optimizer(model, r)
opt.load_state_dict(saved['optimizer'])
model.train()
step = 0
n_steps = None
while True:
    rng = np.random.default_rng([7, step])
    xr = tc.ar_batch(tokens, rng, 8, 255)
    mr = torch.from_numpy(tc.diffusion_masks(rng, 8, 256, B))
    idx = rng.integers(0, data.shape[0], 8)
    xd = torch.from_numpy(data[idx])
    md = np.zeros((8, 256), bool)
    md[:, P:] = tc.diffusion_masks(rng, 8, G, B)
    md = torch.from_numpy(md)
    x = torch.cat([xr, xd]); masked = torch.cat([mr, md])
    isd = torch.zeros_like(masked); isd[8:] = True
    if n_steps is None and step == 3:
        per = (time.time() - t1) / 2
        n_steps = int(MINUTES * 60 / per); log(f'{per:.2f}s/step -> {n_steps} steps')
    if step == 1: t1 = time.time()
    N = n_steps or 10**9
    lr = LR * min(1.0, (step + 1) / 20) * (0.5 * (1 + math.cos(math.pi * min(1, step / N)))) if n_steps else LR * (step + 1) / 20
    with tc.autocast(r, 'cpu'):
        noisy = torch.where(masked, torch.full_like(x, tc.MASK_ID), x)
        L = x.shape[1]
        h = model.hidden(torch.cat([x, noisy], 1), tc.Plan.make('two_copy', 2 * L, B))[:, L:]
        logits = model.lm_head(h[masked]).float()
        target = x[masked]
        ce = F.cross_entropy(logits, target, reduction='none')
        d = isd[masked]
        loss = ce.mean()
        if BETA > 0:
            lp = torch.log_softmax(logits, -1)
            ent = -(lp.exp() * lp).sum(-1)
            right = (logits.argmax(-1) == target) & d
            if right.any(): loss = loss + BETA * ent[right].mean()
        aux = model.aux_loss()
    for g in opt.param_groups: g['lr'] = lr
    opt.zero_grad(set_to_none=True)
    (loss + 0.01 * aux).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    step += 1
    if step % 20 == 0:
        acc_d = (logits.argmax(-1) == target)[d].float().mean().item(); acc_r = (logits.argmax(-1) == target)[~d].float().mean().item()
        log(f'step {step}/{N} loss {loss.item():.3f} ce_real {ce[~d].mean().item():.3f} ce_dist {ce[d].mean().item():.3f} acc_r {acc_r:.3f} acc_d {acc_d:.3f} lr {lr:.2e}')
    if n_steps and step >= n_steps: break
model.eval()
torch.save({'model': model.state_dict(), 'shape': saved['shape']}, OUT / 'distilled.pt')
tc.export(model.cpu(), (SRC / 'hf' / 'tokenizer.model').read_bytes(), OUT / 'hf')
tc.convert(OUT / 'hf', OUT / 'clover-small.gguf', 'q8_0')
for f in ('eval_tokens.npy',):
    if not (OUT / f).exists(): os.symlink((SRC / f).resolve(), OUT / f)
res = tc.evaluate(OUT, OUT / 'clover-small.gguf', tc.Recipe(), log, 20, 0, 0.9)
print({k: v for k, v in res.items() if k != 'samples'})
