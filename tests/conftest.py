import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
DATA = Path(__file__).parent / "data"


class FakeTime:
    """A clock the test moves: ``sleep`` advances it, nothing waits."""

    def __init__(self, start: float = 100.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def wall(self) -> float:
        return 1_800_000_000.0 + self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


@pytest.fixture
def h200_trace() -> Path:
    return DATA / "h200"


@pytest.fixture(scope="session")
def ptxas():
    """Assemble PTX with the ptxas Triton ships, for the arch its `.target` names; return stderr.

    Triton runs `ptxas-blackwell` (CUDA 13) for sm_90+ and plain `ptxas` (12.9, PTX <= 8.8) below;
    the nvcc 13 fixtures are PTX 9.0 even for sm_80, so the newest one shipped assembles them all."""
    triton = pytest.importorskip("triton")
    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    tool = next((bin_dir / n for n in ("ptxas-blackwell", "ptxas") if (bin_dir / n).exists()), None)
    if tool is None:
        pytest.skip(f"no ptxas under {bin_dir}")

    def assemble(text: str, tmp_path: Path) -> str:
        arch = re.search(r"^\s*\.target\s+(sm_\w+)", text, re.MULTILINE)[1]
        path = tmp_path / "k.ptx"
        path.write_text(text)
        done = subprocess.run([str(tool), f"-arch={arch}", str(path), "-o", os.devnull],
                              check=False, capture_output=True, text=True)
        return "" if done.returncode == 0 else done.stderr

    return assemble
