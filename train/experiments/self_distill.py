"""Experiment (session 5): self-distillation for more tokens per forward, dParallel-style.

Continues a finished run of train_clover.py (its OUT/ckpt.pt and OUT/clover-small.gguf): the runtime
greedily decodes 64 tokens after N_GEN random 192-token windows of the training stream (threshold 0.9),
then fine-tuning mixes 8 ordinary diffusion sequences with 8 of those self-generated ones per step
(masks only on the generated 64 tokens), cross-entropy plus BETA x the entropy of the masked positions
the model already gets right ("certainty forcing"). Exports, converts and runs train_clover's --eval
metrics on the result. Not part of the shipped recipe: see train/README.md ("Tried after the shipped run").

    python train/experiments/self_distill.py SRC_OUT EXP_OUT N_GEN MINUTES BETA LR
    python train/experiments/self_distill.py train/out /tmp/distill 1500 12 0.5 3e-4   # the run reported
"""
import sys, time, json, math, os
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import numpy as np, torch, torch.nn.functional as F
import train_clover as tc
torch.set_num_threads(2)
SRC = Path(sys.argv[1])
OUT = Path(sys.argv[2]); OUT.mkdir(exist_ok=True, parents=True)
N_GEN = int(sys.argv[3]); MINUTES = float(sys.argv[4]); BETA = float(sys.argv[5]); LR = float(sys.argv[6])
log = lambda s: print(time.strftime('%H:%M:%S'), s, flush=True)
saved = torch.load(SRC / 'ckpt.pt', map_location='cpu', weights_only=False)
shape = tc.Shape(**saved['shape'])
model = tc.Clover(shape); model.load_state_dict(saved['model'])
tokens = np.load(SRC / 'train_tokens.npy')
B = shape.block_length
P, G = 192, 64
gen_path = OUT / 'gen.npy'
if gen_path.exists():
    data = np.load(gen_path)
else:
    import clover_cpu
    m = clover_cpu.load(SRC / 'clover-small.gguf', threads=2)
    rng = np.random.default_rng(123)
    rows = []
    t = time.time()
    for i in range(N_GEN):
        s = int(rng.integers(0, tokens.size - P - 1))
        p = [int(x) for x in tokens[s:s + P]]
        out = []
        for ev in m.generate(p, max_new_tokens=G, threshold=0.9, stop_at_eos=False):
            out += ev.tokens
        rows.append(p + out[:G])
        if i % 200 == 0: log(f'gen {i} {time.time()-t:.0f}s')
    data = np.array(rows, np.int64)
    np.save(gen_path, data)
log(f'gen data {data.shape}')
r = tc.Recipe(precision='bf16' if tc.cpu_has_bf16() else 'fp32')
opt = tc.make_optimizer(model, r)
opt.load_state_dict(saved['optimizer'])
model.train()
t0 = time.time(); step = 0
# time one step to plan
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
tc.export(model.cpu(), (SRC / 'hf' / 'tokenizer.model').read_bytes(), OUT / 'hf')
tc.convert(OUT / 'hf', OUT / 'clover-small.gguf', 'q8_0')
for f in ('eval_tokens.npy',):
    if not (OUT / f).exists(): os.symlink(SRC / f, OUT / f)
res = tc.evaluate(OUT, OUT / 'clover-small.gguf', tc.Recipe(), log, 20, 0, 0.9)
print({k: v for k, v in res.items() if k != 'samples'})
