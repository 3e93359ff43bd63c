"""Experiment (2026-12-03): self-distillation for more tokens per forward, dParallel-style.

Continues a finished run of train_clover.py (its OUT/ckpt.pt and OUT/clover-small.gguf): the runtime
greedily decodes 64 tokens after N_GEN random 192-token windows of the training stream (threshold 0.9),
then fine-tuning mixes 8 ordinary diffusion sequences with 8 of those self-generated ones per step
(masks only on the generated 64 tokens), cross-entropy plus BETA x the entropy of the masked positions
the model already gets right ("certainty forcing"). Exports, converts and runs train_clover's --eval
metrics on the result. Not part of the shipped recipe: see train/README.md ("Tried after the shipped run").

    python train/experiments/self_distill.py SRC_OUT EXP_OUT N_GEN MINUTES BETA LR
    python train/experiments/self_distill.py train/out /tmp/distill 1500 12 0.5 3e-4   # the run reported
"""
import sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import numpy as np
from distill_common import finetune_and_evaluate, log, setup
SRC, OUT, N_GEN, MINUTES, BETA, LR, model, saved, tokens = setup()
shape = model.shape
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
finetune_and_evaluate(model, saved, tokens, data, P, G, SRC, OUT, MINUTES, BETA, LR, log)
