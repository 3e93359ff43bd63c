#!/usr/bin/env bash
# One call of the device machine (one H200, 16 cores, no network): two trainings side by side on the GPU,
# `small` (the shipped shape) and `medium` (16.1M parameters, the 20 MB cap), with the token streams and
# tokenizer made on the development machine (train/data/, carried: the device's Python is another version,
# so its standard library would give other streams). Each run stops after --no-convert's export; the weights
# come back through train/experiments/gpu_pack.py ($OUT takes at most 8 files of 16 MB).
# Back here: `python train/experiments/gpu_pack.py unpack DIR DEST` (its docstring says what follows).
#
#   python train/train_clover.py --out train/data --data-only      (here, once; train/data/ is not committed)
#   MIN=8 bash train/experiments/gpu_run.sh        (on the device machine, from the repository root,
#                                                     carrying train/data)
set -u
OUT=${OUT:-/tmp/gpu_out}
MIN=${MIN:-8}
DEVICE=${DEVICE:-cuda}   # DEVICE=cpu AR_BATCH=2 DIFF_BATCH=2 MIN=0.5: a dry run anywhere
AR_BATCH=${AR_BATCH:-64}
DIFF_BATCH=${DIFF_BATCH:-128}
[[ -s train/data/train_tokens.npy && -s train/data/eval_tokens.npy && -s train/data/tokenizer.model ]] || {
    echo "gpu_run.sh: train/data/ is missing: make it with --data-only and carry it" >&2
    exit 2
}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, sentencepiece, safetensors, numpy; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
for v in small medium; do
    # (the three files --data-only makes, as gpu_pack.py's DATA_FILES; not its train.log)
    rm -rf "/tmp/run_$v" && mkdir -p "/tmp/run_$v" &&
        cp train/data/tokenizer.model train/data/train_tokens.npy train/data/eval_tokens.npy "/tmp/run_$v/"
    # (a run past its budget is stopped so that the pack still happens: it then sends its last checkpoint)
    timeout "$(python3 -c "print(int($MIN * 60 + 45))")" python3 train/train_clover.py --out "/tmp/run_$v" --preset "$v" --device "$DEVICE" --minutes "$MIN" --no-convert \
        --ar-batch "$AR_BATCH" --diff-batch "$DIFF_BATCH" --log-every 50 --eval-every 250 --save-minutes 3 --threads 2 \
        > "/tmp/run_$v/stdout.txt" 2>&1 &
done
wait
for v in small medium; do echo "== $v"; tail -n 25 "/tmp/run_$v/stdout.txt"; done
python3 train/experiments/gpu_pack.py pack "$OUT" /tmp/run_small /tmp/run_medium
status=$?
ls -la "$OUT"
exit $status
