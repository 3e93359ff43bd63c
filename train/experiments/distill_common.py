"""The fine-tuning stage shared by the self-distillation experiments (self_distill.py, distill_parsed.py):
each step mixes 8 ordinary diffusion sequences of the training stream with 8 rows of `data` (P context
tokens + G generated ones; masks only on the generated tokens); loss = cross-entropy over the masked
positions + BETA x the entropy of the masked generated positions the model already gets right
("certainty forcing"); AdamW continues from the checkpoint's state, warm-up 20 steps then cosine,
sized from the first steps' speed to fill MINUTES. Then export, conversion and train_clover's --eval.
"""
import math, os, sys, time
from pathlib import Path

import numpy as np, torch, torch.nn.functional as F
import train_clover as tc


def log(s):
    print(time.strftime('%H:%M:%S'), s, flush=True)


def setup():
    """The experiments' common command line (SRC_OUT EXP_OUT N MINUTES BETA LR) and the finished run's
    model, checkpoint and training tokens: (SRC, OUT, N, MINUTES, BETA, LR, model, saved, tokens)."""
    torch.set_num_threads(2)
    SRC = Path(sys.argv[1])
    OUT = Path(sys.argv[2])
    OUT.mkdir(exist_ok=True, parents=True)
    N, MINUTES, BETA, LR = int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
    saved = torch.load(SRC / 'ckpt.pt', map_location='cpu', weights_only=False)
    model = tc.Clover(tc.Shape(**saved['shape']))
    model.load_state_dict(saved['model'])
    tokens = np.load(SRC / 'train_tokens.npy')
    return SRC, OUT, N, MINUTES, BETA, LR, model, saved, tokens


def finetune_and_evaluate(model, saved, tokens, data, P, G, SRC: Path, OUT: Path, MINUTES, BETA, LR, log):
    B = model.shape.block_length
    r = tc.Recipe(precision='bf16' if tc.cpu_has_bf16() else 'fp32')
    opt = tc.make_optimizer(model, r)
    opt.load_state_dict(saved['optimizer'])
    model.train()
    step = 0
    n_steps = None
    t1 = time.time()  # (set again at step 1: steps 1-2 time the loop)
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
