"""The layering of STYLE.md rule 1 as a contract the tree is checked against.

* The pure core (catalog, ofu, ptx, the kernel IR, graph, costs, plan) and the see half (what goes
  on every GPU node) import with torch, triton, cuda-python, HiGHS and transformers blocked: the
  solver is imported where a solve happens, the GPU libraries only at the hardware edges. The see
  half and every command's module import without numpy too (the core install has none).
* No import cycle between packages, lazy imports included (an import under ``TYPE_CHECKING`` is a
  type, not a dependency).
* The core imports nothing above it: no hardware edge, no application.

Each checker is first shown to fail on a planted violation, so a pass means something.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).parents[2]
PACKAGE = ROOT / "kernelfleet"
HEAVY = ("torch", "triton", "cuda", "highspy", "transformers")
# Pure: plain data in, plain data out. ``telemetry.sample`` is the records every source yields.
CORE = ("errors", "documents", "catalog", "ofu", "ptx", "kernels", "graph", "costs", "plan",
        "telemetry.sample")
# The light install of every GPU node (README: no torch, triton or solver there).
SEE = ("telemetry", "fleet", "watch", "cli", "cli_common")
# Above the core: what touches hardware, and what a user runs.
EDGES = ("kernels.cuda", "telemetry.nvml", "telemetry.nvml_api", "telemetry.scrape", "telemetry.replay",
         "profile", "runtime", "workloads", "flops", "hook")
APPS = ("cli", "cli_place", "cli_serve", "cli_common", "analyze", "fleet", "watch", "bench", "validation", "serve")


def modules(root: Path = PACKAGE, prefix: str = "kernelfleet") -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join((prefix, *parts))] = path
    return out


def _type_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(path: Path, name: str, prefix: str = "kernelfleet") -> set[str]:
    """The project modules ``path`` imports anywhere (lazily too), less those only for types."""
    found: set[str] = set()
    is_package = path.name == "__init__.py"

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_only(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == prefix)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base if is_package else base[:-1]
                base = base[:len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] == prefix:
                found.add(module)
                found.update(f"{module}.{a.name}" for a in node.names)  # `from pkg import module`
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


def graph(root: Path = PACKAGE, prefix: str = "kernelfleet") -> dict[str, set[str]]:
    """module -> the project modules it imports (names that are not modules are dropped)."""
    known = modules(root, prefix)
    return {m: {i for i in imports(p, m, prefix) if i in known and i != m} for m, p in known.items()}


def package_of(module: str, packages: set[str]) -> str:
    """The innermost package holding ``module`` (a top-level module stands for itself)."""
    parts = module.split(".")
    for k in range(len(parts), 1, -1):
        candidate = ".".join(parts[:k])
        if candidate in packages and candidate != parts[0]:
            return candidate
    return module


def package_cycles(edges: dict[str, set[str]], packages: set[str]) -> list[list[str]]:
    """Strongly connected groups of more than one package (Tarjan), each sorted."""
    between: dict[str, set[str]] = {}
    for source, targets in edges.items():
        a = package_of(source, packages)
        between.setdefault(a, set())
        for target in targets:
            b = package_of(target, packages)
            if a != b:  # a subpackage and its parent are two packages: kernels.cuda may import kernels
                between[a].add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(between.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(between):
        if v not in index:
            strong(v)
    return out


def packages(root: Path = PACKAGE, prefix: str = "kernelfleet") -> set[str]:
    return {m for m, p in modules(root, prefix).items() if p.name == "__init__.py"}


def within(module: str, groups: tuple[str, ...], prefix: str = "kernelfleet") -> bool:
    return any(module == f"{prefix}.{g}" or module.startswith(f"{prefix}.{g}.") for g in groups)


def layer_violations(edges: dict[str, set[str]], prefix: str = "kernelfleet") -> list[str]:
    """``core -> edge or app`` imports: the core must stand on its own."""
    out = []
    for source, targets in sorted(edges.items()):
        if not within(source, CORE, prefix) or within(source, EDGES, prefix):
            continue
        out += [f"{source} -> {t}" for t in sorted(targets)
                if (within(t, EDGES, prefix) or within(t, APPS, prefix)) and not within(t, CORE[-1:], prefix)]
    return out


BLOCKER = """
import importlib, importlib.abc, sys
HEAVY = {heavy!r}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HEAVY:
            raise ImportError(f"{{name}} is blocked: this module must import without it")
sys.meta_path.insert(0, Block())
sys.path.insert(0, {root!r})
failed = []
for name in {names!r}:
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed.append(f"{{name}}: {{type(exc).__name__}}: {{exc}}")
loaded = sorted({{m.split(".")[0] for m in sys.modules}} & set(HEAVY))
print("\\n".join(failed + [f"loaded {{m}}" for m in loaded]))
"""


def blocked_import_failures(names: list[str], root: Path = ROOT, heavy: tuple[str, ...] = HEAVY) -> list[str]:
    """Import each module in a fresh interpreter with the ``heavy`` libraries blocked: what failed."""
    script = BLOCKER.format(heavy=heavy, root=str(root), names=names)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if line]


def light_modules() -> list[str]:
    return [m for m in modules() if (within(m, CORE) or within(m, SEE)) and not within(m, EDGES)]


def _plant(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / "planted" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path / "planted"


def test_the_core_and_the_see_half_import_with_torch_triton_cuda_and_highs_blocked():
    names = light_modules()
    assert {"kernelfleet.plan.milp", "kernelfleet.kernels.ir", "kernelfleet.fleet.agent", "kernelfleet.cli"} <= set(names)
    assert blocked_import_failures(names) == []


def test_the_see_half_imports_with_only_its_own_dependencies():
    """`make run` installs the core dependencies only (pyproject's `dependencies`: no numpy, which
    the planners use): the agent, the dashboard's server, watch and every command's module must
    import without it. kernelfleet.cli once took a flag default from plan.command, which imports
    the MILP and numpy, and the agent did not start on a fresh machine."""
    see = [m for m in modules() if within(m, SEE) and not within(m, EDGES)]
    assert {"kernelfleet.cli", "kernelfleet.fleet.agent", "kernelfleet.fleet.server"} <= set(see)
    assert blocked_import_failures(see + ["kernelfleet.cli_place", "kernelfleet.cli_serve",
                                          "kernelfleet.telemetry.nvml", "kernelfleet.telemetry.replay"],
                                   heavy=(*HEAVY, "numpy")) == []


def test_the_runtimes_pure_parts_import_with_torch_blocked():
    """Plan loading and checking, the serving loop and the monitor run (and are tested) anywhere."""
    pure = ["kernelfleet.runtime.plans", "kernelfleet.runtime.serving", "kernelfleet.runtime.monitor"]
    assert blocked_import_failures(pure) == []


def test_the_blocker_catches_a_module_that_imports_torch(tmp_path):
    root = _plant(tmp_path, {"__init__.py": "", "core.py": "import torch\n", "fine.py": "import json\n"})
    found = blocked_import_failures(["planted.core", "planted.fine"], root.parent)
    assert len(found) == 1 and found[0].startswith("planted.core: ImportError: torch is blocked")


def test_no_import_cycle_between_packages():
    assert package_cycles(graph(), packages()) == []


def test_the_cycle_check_finds_a_planted_cycle_and_ignores_type_only_imports(tmp_path):
    root = _plant(tmp_path, {
        "__init__.py": "",
        "a/__init__.py": "", "a/x.py": "from planted.b import y\n",
        "b/__init__.py": "", "b/y.py": "def f():\n    from planted.a import x\n",  # a lazy import still ties
        "c/__init__.py": "", "c/z.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from planted.a import x\n",
        "d/__init__.py": "", "d/w.py": "from planted.c import z\n",
    })
    edges = graph(root, "planted")
    assert package_cycles(edges, packages(root, "planted")) == [["planted.a", "planted.b"]]


def test_the_core_imports_no_hardware_edge_and_no_application():
    assert layer_violations(graph()) == []


def test_the_layer_check_finds_a_planted_violation():
    edges = {"kernelfleet.plan.policy": {"kernelfleet.runtime.executor", "kernelfleet.plan.model"},
             "kernelfleet.kernels.ir": {"kernelfleet.kernels.cuda.driver"},
             "kernelfleet.ofu.core": {"kernelfleet.telemetry.sample"}}
    assert layer_violations(edges) == ["kernelfleet.kernels.ir -> kernelfleet.kernels.cuda.driver",
                                       "kernelfleet.plan.policy -> kernelfleet.runtime.executor"]


RUN_BLOCKED = """
import importlib.abc, runpy, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {heavy!r}:
            raise ImportError(f"{{name}} is blocked: the see half must run without it")
sys.meta_path.insert(0, Block())
sys.path.insert(0, {root!r})
sys.argv = ["kernelfleet", *sys.argv[1:]]
runpy.run_module("kernelfleet", run_name="__main__")
"""


def test_the_agent_and_its_dashboard_run_with_only_the_core_dependencies(tmp_path):
    """What `make run` starts on a fresh machine, run with numpy and the place half's libraries
    blocked: the agent on the bundled recording serves its API, dashboard and /metrics, and watch
    prints a frame (their lazy imports included, which importing the modules does not reach)."""
    import json
    import time
    import urllib.error
    import urllib.request

    from recorded import free_port

    script = RUN_BLOCKED.format(heavy=(*HEAVY, "numpy"), root=str(ROOT))
    frame = subprocess.run([sys.executable, "-c", script, "watch", "--demo", "--once", "--json"], capture_output=True,
                           text=True, timeout=60)
    assert frame.returncode == 0 and json.loads(frame.stdout), frame.stderr[-2000:]
    port = free_port()
    agent = subprocess.Popen([sys.executable, "-c", script, "agent", "--demo", "--store", str(tmp_path / "kf.db"),
                              "--listen", f"127.0.0.1:{port}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    paths = ("/healthz", "/api/fleet", "/api/overview?k=3", "/api/heatmap", "/api/jobs/summary", "/metrics", "/")
    answers: dict[str, int | None] = dict.fromkeys(paths)
    try:
        for path in paths:
            deadline = time.monotonic() + 30
            while answers[path] is None and agent.poll() is None and time.monotonic() < deadline:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
                        answers[path] = reply.status
                except urllib.error.HTTPError as exc:  # an answer, not a server still starting
                    answers[path] = exc.code
                except OSError:
                    time.sleep(0.5)
    finally:
        agent.terminate()
        _, stderr = agent.communicate(timeout=30)
    assert answers == dict.fromkeys(paths, 200), (answers, stderr[-2000:])
    assert "blocked" not in stderr and "Traceback" not in stderr, stderr[-2000:]
