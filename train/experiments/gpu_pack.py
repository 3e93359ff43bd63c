"""Carry training runs back from the device machine and unpack them here (train/experiments/gpu_run.sh).

The device returns at most 8 files of 16 MB, so `pack` writes each run's logs and weights into one tar split
into 15 MB parts: the tensors of 16384 or more values as float16 (the converter quantises those matrices to
q8_0, far coarser), the rest (norms, gates, conv) as float32. A run cut before its export travels as its last
checkpoint's weights, with the export's config and tokenizer files. `unpack` rebuilds ordinary run folders: logs, the token streams and
tokenizer of train/data/ (what the device trained on), and hf/ with model.safetensors in float32.

    python3 gpu_pack.py pack OUT RUN_DIR...     (on the device; RUN_DIR's name becomes the variant's)
    python  gpu_pack.py unpack OUT DEST         (here), then per variant V:
    python -m clover_cpu convert DEST/V/hf -o DEST/V/clover-small.gguf --type q8_0
    python train/train_clover.py --out DEST/V --preset V --eval
"""

from __future__ import annotations

import io
import shutil
import sys
import tarfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

HERE = Path(__file__).resolve().parent
DATA = HERE.parent / "data"
DATA_FILES = ("tokenizer.model", "train_tokens.npy", "eval_tokens.npy")  # what --data-only makes
LOGS = ("train.log", "stdout.txt", "plan.json", "history.json", "loss.png")
HF = ("config.json", "tokenizer.model", "tokenizer_config.json")
PART = 15_000_000
F16_MIN = 16_384  # tensors of at least this many values travel as float16 (norms, gates, conv: float32)


def checkpoint_folder(run: Path, tmp: Path) -> dict:
    """A run cut before its export: the last checkpoint's weights, with the config.json and tokenizer files of
    an export, so the unpacked folder converts like any other."""
    sys.path.insert(0, str(HERE.parent))
    import train_clover as tc

    ck = torch.load(run / "ckpt.pt", map_location="cpu", weights_only=False)
    model = tc.Clover(tc.Shape(**ck["shape"]))
    model.load_state_dict(ck["model"])
    tc.export(model, (run / "tokenizer.model").read_bytes(), tmp)
    (tmp / "FROM_CHECKPOINT").write_text(f"weights of ckpt.pt ({ck['state']['phase']} step {ck['state']['step']})\n")
    return {k: t.float().contiguous() for k, t in model.state_dict().items()}


def pack(out: Path, runs: list[Path]) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for run in runs:
            v = run.name.removeprefix("run_")
            for name in LOGS:
                if (run / name).exists():
                    tar.add(run / name, f"{v}/{name}")
            hf = run / "hf"
            if (hf / "model.safetensors").exists():
                sd = load_file(str(hf / "model.safetensors"))
            elif (run / "ckpt.pt").exists():
                hf = run / "hf_ckpt"
                sd = checkpoint_folder(run, hf)
                tar.add(hf / "FROM_CHECKPOINT", f"{v}/FROM_CHECKPOINT")
            else:
                print(f"{v}: no weights (neither hf/ nor ckpt.pt); logs only")
                continue
            for name in HF:
                tar.add(hf / name, f"{v}/{name}")
            for name, part in (
                ("f32.safetensors", {k: t.contiguous() for k, t in sd.items() if t.numel() < F16_MIN}),
                ("f16.safetensors", {k: t.half().contiguous() for k, t in sd.items() if t.numel() >= F16_MIN}),
            ):
                tmp = run / name
                save_file(part, str(tmp))
                tar.add(tmp, f"{v}/{name}")
                tmp.unlink()
            print(f"{v}: {len(sd)} tensors packed")
    blob = buf.getvalue()
    out.mkdir(parents=True, exist_ok=True)
    for i in range(0, len(blob), PART):
        (out / f"pack.tar.{i // PART:02d}").write_bytes(blob[i : i + PART])


def unpack(src: Path, dest: Path, data: Path = DATA) -> list[Path]:
    """Run folders DEST/VARIANT for the variants that came back with weights; a variant with logs only gets
    its logs (and a message)."""
    parts = sorted(src.glob("pack.tar.*"))
    if not parts:
        raise SystemExit(f"no pack.tar.* parts in {src}")
    tmp = dest / "_pack"
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(b"".join(p.read_bytes() for p in parts))) as tar:
        try:
            tar.extractall(tmp, filter="data")
        except TypeError:  # Pythons before the tarfile filters (3.11.4, 3.10.12, 3.9.17): our own archive
            tar.extractall(tmp)
    runs = []
    for vdir in sorted(tmp.iterdir()):
        run = dest / vdir.name
        (run / "hf").mkdir(parents=True, exist_ok=True)
        for f in vdir.iterdir():
            if f.suffix != ".safetensors":
                shutil.copy(f, run / "hf" / f.name if f.name in HF else run / f.name)
        if not (vdir / "f32.safetensors").exists():
            print(f"{run}: logs only (the run came back without weights)")
            continue
        sd = load_file(str(vdir / "f32.safetensors"))
        sd.update({k: t.float() for k, t in load_file(str(vdir / "f16.safetensors")).items()})
        save_file(sd, str(run / "hf" / "model.safetensors"))
        for name in DATA_FILES:
            shutil.copy(data / name, run / name)
        runs.append(run)
        print(f"{run}: unpacked")
    shutil.rmtree(tmp)
    return runs


if __name__ == "__main__":
    if len(sys.argv) < 4 or sys.argv[1] not in ("pack", "unpack"):
        raise SystemExit(__doc__)
    if sys.argv[1] == "pack":
        pack(Path(sys.argv[2]), [Path(p) for p in sys.argv[3:]])
    else:
        unpack(Path(sys.argv[2]), Path(sys.argv[3]))
