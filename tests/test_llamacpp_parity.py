"""llama.cpp loads what `clover-cpu convert` writes and decodes the same greedy tokens as transformers.

Runs bench/check_llamacpp_parity.py with the peers environment (.venv-peers: torch, transformers with
qwen3_5_moe, llama-cpp-python; built by bench/setup_peers.sh) on a tiny random Qwen3.5-MoE checkpoint.
The converter under test is this interpreter's clover_cpu, the package the rest of the suite tests.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PEERS = Path(os.environ.get("PEERS_VENV", REPO / ".venv-peers"))
PEERS_PYTHON = PEERS / "bin" / "python"
CHECK = REPO / "bench" / "check_llamacpp_parity.py"


def _has_converter() -> bool:
    try:
        return importlib.util.find_spec("clover_cpu.convert.hf") is not None
    except ImportError:
        return False


@pytest.mark.skipif(
    not PEERS_PYTHON.exists(),
    reason=f"no peers environment at {PEERS} (create it with: bash bench/setup_peers.sh)",
)
@pytest.mark.skipif(not _has_converter(), reason="clover_cpu.convert.hf (the converter) is not installed")
def test_llamacpp_parity(tmp_path):
    cmd = [str(PEERS_PYTHON), str(CHECK), "--convert-python", sys.executable, "--keep", str(tmp_path)]
    p = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=1800, cwd=tmp_path)
    out = p.stdout + p.stderr
    verdict = [ln for ln in out.splitlines() if ln.startswith("VERDICT")]
    assert p.returncode == 0, f"{' '.join(cmd)} exited {p.returncode}:\n{out[-12000:]}"
    assert verdict and verdict[-1].startswith("VERDICT: PASS"), out[-12000:]
