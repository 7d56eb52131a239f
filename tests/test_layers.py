"""pipelines/ holds the Ray and PyTorch logic and must stay free of Prefect."""

import ast
import subprocess
import sys
from pathlib import Path

PIPELINES = Path(__file__).resolve().parents[1] / "trainflow" / "pipelines"


def test_pipelines_source_never_imports_prefect():
    offenders = []
    for path in sorted(PIPELINES.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] == "prefect"]
    assert offenders == []


def test_importing_every_pipeline_module_loads_no_prefect():
    modules = [f"trainflow.pipelines.{p.stem}" for p in PIPELINES.glob("*.py") if p.stem != "__init__"]
    assert len(modules) >= 7
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in modules)
        + ("print(sorted(m for m in sys.modules if m.split('.')[0] == 'prefect'))")
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
