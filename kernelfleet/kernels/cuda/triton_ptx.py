"""Find the PTX of Triton kernels (hand-written or made by torch.compile) by kernel name.

Triton writes every compiled kernel into its cache directory as ``<hash>/<name>.ptx`` beside
``<name>.json`` (its metadata: ``num_warps``, dynamic ``shared`` bytes). A captured launch
carries only the function name, its block size and its dynamic shared memory; those three pick
the PTX that ran among the variants an autotuner compiled under the same name.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

_ENTRY = re.compile(r"\.entry\s+([A-Za-z_$][\w$]*)\s*\(")


def default_dirs() -> list[Path]:
    """Where Triton and TorchInductor keep compiled kernels on this machine."""
    dirs = [Path(os.environ["TRITON_CACHE_DIR"])] if os.environ.get("TRITON_CACHE_DIR") else []
    dirs.append(Path.home() / ".triton" / "cache")
    try:
        from torch._inductor.runtime.runtime_utils import cache_dir

        dirs.append(Path(cache_dir()))
    except (ImportError, AttributeError):  # an older torch: the Triton cache is enough
        pass
    return [d for d in dirs if d.is_dir()]


def index(dirs: Iterable[Path], names: set[str]) -> dict[str, list[dict]]:
    """For each wanted kernel name, its PTX variants as ``{"ptx", "threads", "shared_bytes"}``."""
    found: dict[str, list[dict]] = {}
    seen: set[str] = set()
    for directory in dirs:
        for path in sorted(Path(directory).rglob("*.ptx")):  # names may be cut short: read every file
            text = path.read_text(errors="replace")
            if text in seen:
                continue
            seen.add(text)
            meta = _metadata(path.with_suffix(".json"))
            for name in set(_ENTRY.findall(text)) & names:
                found.setdefault(name, []).append({"ptx": text, **meta})
    return found


def _metadata(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {"threads": None, "shared_bytes": None}
    warps, width = doc.get("num_warps"), doc.get("warp_size", 32)
    return {"threads": warps * width if isinstance(warps, int) else None,
            "shared_bytes": doc.get("shared") if isinstance(doc.get("shared"), int) else None}
