"""The import direction that docs/architecture.md states, checked on the source.

Layers, from the bottom: ``config``, ``files``, ``timeline``, ``start_wait`` and ``ray_internals``;
``workspace``, ``signals``, ``cluster``, ``stack``, ``prefect_server`` and ``prefect_internals``;
``pipelines`` and ``serving``; ``tasks`` and ``run_checks``; ``flows`` and ``runtime``; ``cli``
and ``testing``.
A module imports only from its own layer or below, wherever the import statement sits
(a lazy import inside a function is a dependency too), and only ``cli`` imports
``trainflow.cli``, ``testing`` and the package root included. Prefect is imported only from the
orchestration layers, never by ``pipelines`` or the layers below. And no module depends on itself through
others: no two modules import each other, directly or around a longer loop, at import
time or lazily.
"""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "trainflow"

# The layer of each top-level module or subpackage of trainflow, bottom first.
LAYERS = {
    "config": 0,
    "files": 0,
    "timeline": 0,
    "start_wait": 0,
    "version": 0,
    "ray_internals": 0,  # every use of Ray's private names (tests/test_ray_internals.py)
    "workspace": 1,
    "signals": 1,
    "cluster": 1,
    "prefect_server": 1,
    "stack": 1,  # a team's services and one user's warm start, which cli.stack runs
    "prefect_internals": 1,  # every use of Prefect's private names (tests/test_prefect_internals.py)
    "pipelines": 2,
    "serving": 2,  # the facade of pipelines.serving for users: trainflow.serving.app
    "tasks": 3,
    "flows": 4,
    "cli": 5,
    "testing": 5,
    "run_checks": 3,
    "runtime": 4,
}
# Where Prefect may be imported.
PREFECT_LAYERS = {"prefect_server", "prefect_internals", "tasks", "flows", "runtime", "cli", "testing"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _part(module: str) -> str | None:
    """The layer name of a trainflow module (None for the package root)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _imports(path: Path, module: str, *, top_level_only: bool = False) -> list[tuple[str, int]]:
    """Every module an import statement in ``path`` names, with its line; relative
    imports resolved; ``from package import name`` also names ``package.name`` when that
    is a module."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.append((base, node.lineno))
            found += [(f"{base}.{a.name}", node.lineno) for a in node.names if f"{base}.{a.name}" in MODULES]
    return found


def test_every_module_has_a_layer():
    unknown = sorted({_part(m) for m in MODULES if _part(m) is not None} - set(LAYERS))
    assert unknown == [], f"add {unknown} to LAYERS here and to docs/architecture.md"


def test_imports_point_down():
    offenders = []
    for module, path in MODULES.items():
        part = _part(module)
        if part is None:  # the package root: a facade over everything (load_model, the config)
            continue
        for name, line in _imports(path, module):
            if name == "trainflow":  # the root: __version__
                continue
            if name.startswith("trainflow."):
                target = name.split(".")[1]
                if LAYERS.get(target, -1) > LAYERS[part]:
                    offenders.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({part}) imports {name}")
            elif name.split(".")[0] == "prefect" and part not in PREFECT_LAYERS:
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({part}) imports {name}")
    assert offenders == []


def test_only_the_command_line_imports_it():
    """No module outside ``trainflow/cli/`` imports ``trainflow.cli``, wherever the import sits
    (a lazy one, or ``importlib.import_module`` by name): ``testing`` and the package root,
    which the layer check lets lean on ``cli``'s layer, included."""
    loaders = {"importlib.import_module", "import_module", "__import__"}
    offenders = []
    for module, path in MODULES.items():
        if _part(module) == "cli":
            continue
        by_name = [
            (node.args[0].value, node.lineno)
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and ast.unparse(node.func) in loaders and node.args
            if isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
        ]
        for name, line in [*_imports(path, module), *by_name]:
            if name == "trainflow.cli" or name.startswith("trainflow.cli."):
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}")
    assert offenders == []


def test_no_import_cycles():
    graph = {
        module: {
            name
            for name, _ in _imports(path, module)
            if name in MODULES and name != module and name != "trainflow"
        }
        for module, path in MODULES.items()
    }
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if m.startswith(n + "."):  # a package's own __init__ runs before its modules
                continue
            if state.get(n) == 1:
                cycles.append(" -> ".join([*stack[stack.index(n) :], n]))
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert cycles == []


@pytest.mark.slow
def test_importing_pipelines_and_the_bottom_layers_loads_no_prefect():
    modules = [
        m
        for m in MODULES
        if _part(m)
        in {"config", "files", "timeline", "ray_internals", "workspace", "signals", "cluster", "pipelines"}
    ]
    assert len(modules) >= 10
    code = "import sys\n" + "".join(f"import {m}\n" for m in modules)
    code += "print(sorted(m for m in sys.modules if m.split('.')[0] == 'prefect'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_what_ray_trains_controller_unpickles_of_a_run_imports_no_torch():
    # The controller of every training unpickles its trainer's backend config and its
    # scaling policy (trainflow.ray_internals.training), and at the end what the workers'
    # training function returned (an Outcome) from their last status: each class's module
    # is imported there.
    import pickle

    from trainflow import ray_internals
    from trainflow.pipelines.training.settings import Outcome

    sent = pickle.dumps((ray_internals.torch_config(), Outcome("completed", 3)))
    code = (
        "import sys, pickle\n"
        "config, outcome = pickle.loads(sys.stdin.buffer.read())\n"
        "from trainflow.ray_internals.training import FixedClusterPolicy, TorchConfig\n"
        "assert type(config) is TorchConfig and outcome.status == 'completed'\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    )
    out = subprocess.run([sys.executable, "-c", code], input=sent, capture_output=True, check=True)
    assert out.stdout.decode().strip() == "[]"


# What a default training run does not use: drift, sweeps, batch prediction, serving, Hugging
# Face, a user's own loop, and the registry's modules until the register step.
OPTIONAL_FEATURES = (
    "trainflow.tasks.drift",
    "trainflow.pipelines.drift.compare",
    "trainflow.pipelines.drift.samples",
    "trainflow.tasks.sweep",
    "trainflow.pipelines.sweep.run",
    "trainflow.pipelines.sweep.search",
    "trainflow.tasks.predict",
    "trainflow.pipelines.evaluation.predict",
    "trainflow.tasks.serving",
    "trainflow.pipelines.hf_hub",
    "trainflow.pipelines.models.hf",
    "trainflow.pipelines.training.user_loop",
    "trainflow.pipelines.training.loop_reports",
    "trainflow.pipelines.registry.registration",
    "trainflow.pipelines.registry.versions",
    "trainflow.pipelines.registry.card",
)
FLOW_MODULES = 85  # at most; down to 60 as modules merge


@pytest.mark.slow
def test_importing_the_training_flow_loads_what_a_default_run_uses():
    code = (
        "import sys, trainflow.flows.training\n"
        "print(*[m for m in sys.modules if m.split('.')[0] == 'trainflow'])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = out.stdout.split()
    assert [m for m in OPTIONAL_FEATURES if m in loaded] == []
    assert len(loaded) <= FLOW_MODULES, loaded


DOC = PACKAGE.parent / "docs" / "architecture.md"


def _doc_lines() -> list[list[str]]:
    """The backticked path tokens of each line of docs/architecture.md."""
    import re

    lines = []
    for line in DOC.read_text().splitlines():
        tokens = [t.split()[0] for t in re.findall(r"`([^`]+)`", line) if t.strip()]
        lines.append([t for t in tokens if t.endswith((".py", "/")) or ("/" in t and "." in t)])
    return lines


def test_the_architecture_doc_names_every_module():
    """Each module of trainflow/ appears on the page: by its path, or by its file name on a
    line that names its folder."""
    lines = _doc_lines()
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.name == "__init__.py" and relative.parent != Path("."):
            continue  # a package's face: its folder stands for it
        as_posix, parent = relative.as_posix(), relative.parent.name
        named = any(
            any("/" in t and as_posix.endswith(t) for t in tokens)
            or (relative.name in tokens and (not parent or any(f"{parent}/" in t for t in tokens)))
            for tokens in lines
        )
        if not named:
            missing.append(relative.as_posix())
    assert missing == [], f"name these in {DOC.name}"


def test_every_path_the_architecture_doc_names_exists():
    repo = PACKAGE.parent
    missing = []
    for tokens in _doc_lines():
        for token in tokens:
            found = [(repo / token).exists(), any(PACKAGE.rglob(token.rstrip("/")))]
            if not any(found):
                missing.append(token)
    assert missing == [], f"{DOC.name} names paths that do not exist"


def test_rooms_stay_small():
    """No module over 500 lines, no function over 60, no step (a Prefect task) over 25,
    each counted from its def line to its last."""
    too_long = []
    for module, path in MODULES.items():
        text = path.read_text()
        if len(text.splitlines()) > 500:
            too_long.append(f"{module}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            lines = node.end_lineno - node.lineno + 1
            decorators = [ast.unparse(d) for d in node.decorator_list]
            limit = 25 if any(d.startswith(("step(", "task(", "task")) for d in decorators) else 60
            if lines > limit:
                too_long.append(f"{module}.{node.name}: {lines} lines (at most {limit})")
    assert too_long == []


def test_the_formatter_is_turned_off_only_for_tables_of_data():
    """A ``# fmt: skip`` keeps a table's rows as a reader scans them (a literal list or dict
    closed on its line); a call squeezed onto fewer lines to fit a limit is split instead."""
    skipped = [
        f"{module}:{number}"
        for module, path in MODULES.items()
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if line.rstrip().endswith("# fmt: skip") and not line.strip().startswith(("]", "}"))
    ]
    assert skipped == []


def test_values_are_assigned_one_name_at_a_time():
    """No ``logger, served = get_run_logger(), []``: two values packed on one line to save
    one are two assignments. Unpacking what a call returns (``a, b = f()``) stays."""
    packed = [
        f"{module}:{node.lineno}"
        for module, path in MODULES.items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Tuple)
        and isinstance(node.value, ast.Tuple)
    ]
    assert packed == []


def _imported(node: ast.Import | ast.ImportFrom, alias: ast.alias) -> str:
    """The dotted name an import brings in: ``a.b.c`` for ``from a.b import c``."""
    module = node.module if isinstance(node, ast.ImportFrom) else None
    return f"{module}.{alias.name}" if module else alias.name


def test_trainflows_own_modules_are_imported_under_names_that_say_what_they_are():
    """No alias of a trainflow module shorter than three letters (``as ev``, ``as tf``): a
    reader meets ``scoring.`` or ``transforms.``; the ecosystem's ``np``, ``pd``, ``pa``, ``nn``
    stay."""
    short = [
        f"{module}: {ast.unparse(node)}"
        for module, path in MODULES.items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom | ast.Import)
        and any(_imported(node, a).startswith("trainflow") and len(a.asname or "xyz") < 3 for a in node.names)
    ]
    assert short == []


TESTS = PACKAGE.parent / "tests"
# Where Ray's private names may appear: the quarantine, its tests, and this file's patterns.
QUARANTINE = {PACKAGE / "ray_internals", TESTS / "test_ray_internals.py", Path(__file__).resolve()}
# Where Prefect's private names may appear (a private attribute read by name among them).
PREFECT_QUARANTINE = {
    PACKAGE / "prefect_internals.py",
    TESTS / "test_prefect_internals.py",
    Path(__file__).resolve(),
}
# Ray's environment variables that its user guides document as settings; any other RAY_* name is
# an internal switch, set only through trainflow/ray_internals/switches.py.
RAY_SETTINGS = {
    "RAY_ADDRESS",  # ray.init's address
    "RAY_AUTH_MODE",  # token authentication
    "RAY_AUTH_TOKEN",
    "RAY_AUTH_TOKEN_PATH",
    "RAY_USAGE_STATS_ENABLED",  # usage stats
}


def _outside_quarantine(quarantine: set[Path] = QUARANTINE) -> list[Path]:
    paths = [*MODULES.values(), *sorted(TESTS.rglob("*.py"))]
    return [p for p in paths if not any(p == q or q in p.parents for q in quarantine)]


def test_only_ray_internals_names_rays_private_modules_and_attributes():
    """Outside ``trainflow/ray_internals`` and its test, in trainflow and its tests: no private
    module of Ray's (``ray._private``, ``*._internal``), no ``from ray... import _name``, no
    ``ray.x._name``, and no private attribute read by name (``getattr(x, "_name")``; an
    object's own and the standard library's ``threading`` and ``atexit`` aside: cli/main.py)."""
    import re

    private = re.compile(
        r"ray(\.\w+)*\._(?!_)\w|_internal\b|_internal\.|_private\b|from ray[\w.]* import _\w"
        r"|getattr\((?!self,|threading,|atexit,)[^,]+, [\"']_(?!_)"
    )
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}"
        for path in _outside_quarantine(QUARANTINE | PREFECT_QUARANTINE)
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if private.search(line.split("#")[0])
    ]
    assert found == [], "move each use into trainflow/ray_internals, with a test"


def test_only_prefect_internals_names_prefects_private_names():
    """Outside ``trainflow/prefect_internals.py`` and its test, in trainflow and its tests:
    no ``prefect.x._name``, no ``from prefect... import _name``, no private module of
    Prefect's (``prefect._internal``)."""
    import re

    private = re.compile(r"prefect(\.\w+)*\._(?!_)\w|from prefect[\w.]* import _\w")
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}"
        for path in _outside_quarantine(PREFECT_QUARANTINE)
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if private.search(line.split("#")[0])
    ]
    assert found == [], "move each use into trainflow/prefect_internals.py, with a test"


def test_only_ray_internals_names_rays_internal_switches():
    """Outside the quarantine, in trainflow and its tests, no code names a switch of Ray's
    that :mod:`trainflow.ray_internals.switches` lists, nor any ``RAY_*`` variable Ray does
    not document as a setting (:data:`RAY_SETTINGS`): as a string, a keyword or an attribute."""
    import re

    from trainflow.ray_internals import switches

    def offends(name: str) -> bool:
        undocumented = re.fullmatch(r"RAY_\w+", name) and not any(s.startswith(name) for s in RAY_SETTINGS)
        return name in switches.NAMES or bool(undocumented)

    found = []
    for path in _outside_quarantine():
        for node in ast.walk(ast.parse(path.read_text())):
            names = {
                ast.Constant: lambda n: [n.value] if isinstance(n.value, str) else [],
                ast.keyword: lambda n: [n.arg] if n.arg else [],
                ast.Attribute: lambda n: [n.attr],
            }.get(type(node), lambda n: [])(node)
            found += [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {n}" for n in names if offends(n)]
    assert found == [], "name each switch through trainflow/ray_internals/switches.py, with a test"


# Words: what a reader of a module, function or comment meets before the code.
MODULE_WORDS, FUNCTION_WORDS, ENTRY_WORDS, COMMENT_LINES, PARAGRAPH_WORDS = 150, 80, 25, 4, 100
SECTION = re.compile(r"(Args|Returns|Raises|Yields):")
USE = re.compile(r"\d+(-\d+)?\. ")  # an item of the quarantine's numbered list of uses


def _prose(doc: str, *, quarantine: bool = False) -> tuple[str, list[str]]:
    """A docstring's prose, and each entry of its Args/Returns/Raises/Yields sections, which
    are reference (one per parameter) and counted each on its own. In ``ray_internals`` and
    ``prefect_internals`` the numbered list of uses is left out: it is the quarantine's
    register, a few lines per use."""
    prose, entries, section, use = [], [], False, False
    for line in doc.splitlines():
        if not line.startswith(" "):
            section, use = bool(SECTION.fullmatch(line.strip())), quarantine and bool(USE.match(line))
            if section or use:
                continue
        if use:
            continue
        if not section:
            prose.append(line)
        elif line.startswith("    ") and not line.startswith("     "):
            entries.append(line)
        elif entries:
            entries[-1] += " " + line
    return " ".join(prose), entries


def test_docstrings_say_it_in_a_few_words():
    """A module's docstring at most 150 words (the quarantine's list of uses aside), a
    function's or class's at most 80 (each Args/Returns entry aside, at most 25): what a
    decision took longer to explain goes to docs/architecture.md or a guide."""
    long = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        quarantine = module.startswith(("trainflow.ray_internals", "trainflow.prefect_internals"))
        prose, _ = _prose(ast.get_docstring(tree) or "", quarantine=quarantine)
        if len(prose.split()) > MODULE_WORDS:
            long.append(f"{module}: {len(prose.split())} words")
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                prose, entries = _prose(ast.get_docstring(node) or "")
                over = [len(prose.split()) - FUNCTION_WORDS, *(len(e.split()) - ENTRY_WORDS for e in entries)]
                if max(over) > 0:
                    long.append(f"{module}.{node.name}: {max(over)} words over")
    assert long == []


def test_comments_are_a_few_lines():
    """No run of more than four comment lines: a longer why goes to a docstring or the docs."""
    long = []
    for module, path in MODULES.items():
        run = 0
        for number, line in enumerate([*path.read_text().splitlines(), ""], start=1):
            if line.strip().startswith("#"):
                run += 1
                continue
            if run > COMMENT_LINES:
                long.append(f"{module}:{number - run}: {run} lines")
            run = 0
    assert long == []


def _paragraphs(text: str) -> list[str]:
    """The page's paragraphs and list items, outside code blocks and tables."""
    paragraphs, current, fenced = [], [], False
    for line in [*text.splitlines(), ""]:
        if line.startswith("```"):
            fenced = not fenced
        starts = not line.strip() or line.startswith(("#", "|", "```", "- ")) or re.match(r"\d+\. ", line)
        if (starts or fenced) and current:
            paragraphs.append(" ".join(current))
            current = []
        if not fenced and line.strip() and not line.startswith(("#", "|", "```")):
            current.append(line.strip())
    return paragraphs


def test_the_architecture_doc_says_it_in_paragraphs_of_at_most_100_words():
    long = [p[:60] for p in _paragraphs(DOC.read_text()) if len(p.split()) > PARAGRAPH_WORDS]
    assert long == []


def test_the_architecture_docs_concern_tables_are_one_per_layer():
    """Under "Where each concern lives", one table per layer (a ``### Layer N`` heading), each
    row's modules at most that layer, and one of them in it; then one for what is outside
    ``trainflow/``."""
    section = DOC.read_text().split("## Where each concern lives", 1)[1].split("\n## ", 1)[0]
    wrong, layers = [], []
    for part in section.split("\n### ")[1:]:
        heading, _, body = part.partition("\n")
        match = re.match(r"Layer (\d)", heading)
        layer = int(match.group(1)) if match else None
        layers.append(layer)
        for row in (line for line in body.splitlines() if line.startswith("| ") and "---" not in line):
            where = row.rstrip(" |").rsplit(" | ", 1)[-1]
            tops = {t.split("/")[0].removesuffix(".py") for t in re.findall(r"`([^`]+)`", where)}
            found = {LAYERS[t] for t in tops if t in LAYERS}
            if row.startswith("| concern |"):
                continue
            if (layer is None and found) or (layer is not None and (not found or max(found) != layer)):
                wrong.append(f"{heading}: {row[:60]}")
    assert [x for x in layers if x is not None] == sorted(set(LAYERS.values())), layers
    assert wrong == []


# A model kind's family is named in one table (pipelines/models/kinds.py) and implemented
# in its own modules; config/ validates and describes kinds, and a data source's
# ``torchvision:`` (pipelines/data/sources.py) names a dataset, not a model.
KIND_MODULES = {
    "trainflow.pipelines.models.kinds",
    "trainflow.pipelines.models.builders",
    "trainflow.pipelines.models.hf",
    "trainflow.pipelines.hf_hub",
    "trainflow.pipelines.data.sources",
}
KIND_PREFIXES = {"hf:", "torchvision:"}
KIND_PREFIX_NAMES = {"HF", "TORCHVISION"}


def _names_a_kind_prefix(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.startswith(tuple(KIND_PREFIXES))
    if isinstance(node, ast.Name | ast.Attribute):
        return (node.id if isinstance(node, ast.Name) else node.attr) in KIND_PREFIX_NAMES
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_names_a_kind_prefix(e) for e in node.elts)
    return False


def kind_prefix_tests(source: str) -> list[int]:
    """The lines of ``source`` that test a model kind's prefix (``"hf:"``, ``HF``,
    ``"torchvision:"``, ``TORCHVISION``) with ``startswith``, ``removeprefix``, ``in`` or ``==``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            tested = node.args if node.func.attr in ("startswith", "removeprefix") else []
        elif isinstance(node, ast.Compare):
            tested = [node.left, *node.comparators]
        else:
            tested = []
        if any(_names_a_kind_prefix(arg) for arg in tested):
            lines.append(node.lineno)
    return lines


def test_shared_code_asks_the_table_of_model_kinds_not_their_prefixes():
    """Shared code asks ``kinds.family(kind)`` (or ``ModelConfig.family``) what a model kind
    needs, and never tests whether a kind is ``hf:`` or ``torchvision:`` itself."""
    offenders = [
        f"{module}:{line}"
        for module, path in MODULES.items()
        if module not in KIND_MODULES and not module.startswith("trainflow.config")
        for line in kind_prefix_tests(path.read_text())
    ]
    assert offenders == []
