"""The documentation site: built strictly from the repository (a broken link or a name
mkdocstrings cannot find fails it), its references made from the code, and looked at in
headless Chromium as a reader would."""

import html
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from trainflow.config.reference import field_docs

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    assert "WARNING" not in built.stderr, built.stderr[-3000:]
    return out


@pytest.mark.slow
def test_the_config_reference_shows_every_field_of_the_schema(site):
    page = (site / "reference" / "config" / "index.html").read_text()
    missing = [doc.path for doc in field_docs() if f"<code>{html.escape(doc.path)}</code>" not in page]
    assert missing == []


@pytest.mark.slow
def test_the_command_reference_shows_every_command(site):
    from trainflow.cli.main import click_command

    page = (site / "reference" / "cli" / "index.html").read_text()
    commands = [name for name, command in click_command.commands.items() if not command.hidden]
    assert len(commands) >= 6
    assert [name for name in commands if f"trainflow {name}" not in page] == []


def _docs_module(name: str):
    """A script of docs/ (not a package), imported from its file."""
    spec = importlib.util.spec_from_file_location(f"docs_{name}", REPO / "docs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_link_out_of_docs_goes_to_the_repository_file_and_a_missing_file_fails(caplog):
    hooks = _docs_module("hooks")
    repo_url = "https://github.com/trainflow/trainflow"
    copied = {"benchmarks/results.md", "benchmarks/results/serve.md"}

    def link(target: str, page: str = "guides/data.md") -> str | None:
        return hooks.repository_link(target, page, copied, repo_url)

    assert link("../../configs/churn.yaml") == f"{repo_url}/blob/main/configs/churn.yaml"
    assert link("../../examples/custom_flow#top") == f"{repo_url}/tree/main/examples/custom_flow#top"
    # The benchmark results are pages of the site: a link to one stays on the site.
    assert link("../benchmarks/results/serve.md#x", page="benchmarks.md") == "benchmarks/results/serve.md#x"
    assert link("../reference/config.md#data") is None  # a page: MkDocs checks it
    assert link("https://docs.ray.io/") is None
    assert caplog.records == []

    assert link("../../configs/no-such.yaml") is None
    assert "configs/no-such.yaml is not a file of the repository" in caplog.text


THEME_PRIMARY = (0x40, 0x51, 0xB5)  # Material's indigo, the header bar's colour
FLOW_PICTURE_FILL = (0xE8, 0xEA, 0xF6)  # the steps' boxes in docs/assets/flow.svg


def _png_facts(png: Path) -> tuple[tuple[int, int], int, tuple[int, int, int], int]:
    """A screenshot's size, its distinct colours, the colour at the top of the page (the
    theme's header bar) and how many pixels hold the home page's flow picture's fill."""
    from PIL import Image

    with Image.open(png) as image:
        rgb = image.convert("RGB")
        colours = rgb.getcolors(maxcolors=1 << 24)
        picture = sum(count for count, colour in colours if colour == FLOW_PICTURE_FILL)
        return rgb.size, len(colours), rgb.getpixel((rgb.width // 2, 10)), picture


@pytest.mark.slow
@pytest.mark.skipif(
    _docs_module("screenshots").browser() is None,
    reason="no headless Chromium on this machine (apt-get install -y chromium)",
)
def test_the_home_page_and_the_config_reference_render_in_headless_chromium(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    shot = subprocess.run(
        [sys.executable, str(REPO / "docs" / "screenshots.py"), str(tmp_path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert shot.returncode == 0, shot.stderr[-3000:]
    home, reference = tmp_path / "home.png", tmp_path / "config-reference.png"
    assert shot.stdout.split() == [str(home), str(reference)]

    for png in (home, reference):
        size, colours, top, _ = _png_facts(png)
        assert size == (1400, 1600)
        assert colours > 100, f"{png.name}: {colours} colours, a blank page"
        assert top == THEME_PRIMARY, f"{png.name}: the header is {top}, the theme did not load"
    # The flow picture: its boxes fill a good part of the home page.
    assert _png_facts(home)[3] > 5000


def test_the_troubleshooting_pages_errors_are_what_trainflow_says(tmp_path, monkeypatch, trainflow_home):
    """Each ``error:`` line the page quotes is what the run's checks say for that mistake
    (the CLI prints ``error: `` and the message); paths under /tmp are the test's own."""
    import trainflow
    from tests.commands import trainflow as trainflow_cli
    from trainflow import run_checks
    from trainflow.config import load_config

    page = Path(__file__).resolve().parents[1] / "docs" / "guides" / "troubleshooting.md"
    quoted = [
        line.removeprefix("error: ") for line in page.read_text().splitlines() if line.startswith("error: ")
    ]
    (tmp_path / "t.csv").write_text("a,b\n1,2\n3,4\n")
    # As on a machine of the user's: no cluster or MLflow server named in the environment.
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    mistakes = [
        ({"train": {"lr": -1}}, {}),
        ({"data": {"source": str(tmp_path / "nope.csv")}}, {}),
        ({"data": {"source": str(tmp_path / "t.csv")}}, {}),
        ({"model": {"kind": "torchvision:resnet999"}}, {}),
        ({"model": {"kind": "mypkg.mod:build"}}, {}),
        ({}, {"RAY_ADDRESS": "127.0.0.1:9"}),
        ({}, {"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"}),
    ]
    said = []
    for overrides, env in mistakes:
        with monkeypatch.context() as patch:
            for key, value in env.items():
                patch.setenv(key, value)
            with pytest.raises(Exception) as caught:
                run_checks.before_run(load_config(overrides))
        said.append(str(caught.value).replace(str(tmp_path), "/tmp"))
    with pytest.raises(Exception) as caught:
        trainflow.load_model("nosuch@champion")
    said.append(str(caught.value))
    # A local cluster's size is checked where no Ray session is open yet: in a command's
    # own process, as a user meets it (this one holds the session's cluster).
    out = trainflow_cli("run", "--set", "scaling.num_workers=64", home=tmp_path / "cli-home")
    said.insert(5, out.stderr.strip().removeprefix("error: "))
    said.append(_past_the_start_bound(monkeypatch))
    # The CPUs a local cluster would have and the load are this machine's: the page shows a 2-core one's.
    shortage = "the local Ray cluster on this machine would have"
    load = re.compile(r"load average [\d.]+ on \d+ CPUs")
    assert [load.sub("load", m.split(shortage)[0]) for m in quoted] == [
        load.sub("load", m.split(shortage)[0]) for m in said
    ]


def _past_the_start_bound(monkeypatch) -> str:
    """What a command says when its local Ray cluster misses the start's bound (the default):
    Ray's node raises its timeout."""
    import ray

    from trainflow.cluster import session
    from trainflow.ray_internals.errors import NODE_START_TIMEOUT

    def late(**kwargs):
        raise Exception(
            f"{NODE_START_TIMEOUT}. This could happen because some of the raylet failed to startup"
        )

    with monkeypatch.context() as patch:
        patch.delenv("TRAINFLOW_START_TIMEOUT", raising=False)
        patch.setattr(ray, "init", late)
        with pytest.raises(session.PreflightError) as caught:
            session._local_init(None, {})
    return str(caught.value)


DOCS = REPO / "docs"


def _blocks(page: Path, language: str) -> list[str]:
    """The fenced blocks of ``language`` in a page, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```$", page.read_text(), flags=re.M | re.S)


def _quoted(page: Path) -> list[str]:
    """The lines of a page's output blocks (fenced without a language)."""
    return [line for block in _blocks(page, "") for line in block.splitlines()]


def test_the_tutorials_csv_and_config_validate_as_it_shows(tmp_path, monkeypatch, trainflow_home):
    """The tutorial's CSV snippet, run as written, and its config block, saved as it says,
    pass `trainflow validate` with the line the page quotes (its hash aside); its mistake
    fails with the line it quotes. Its training, serving and UI are what the commands'
    own tests run (tests/e2e/test_tutorial.py, tests/cli): here, the page's inputs are
    checked, in a second or two."""
    from tests.commands import trainflow_in_process

    page = DOCS / "tutorial.md"
    make_csv, _ = _blocks(page, "python")
    (config,) = _blocks(page, "yaml")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    exec(make_csv, {})
    (tmp_path / "tumours.yaml").write_text(config)

    quoted = _quoted(page)
    ok = next(line for line in quoted if line.startswith("ok: "))
    out = trainflow_in_process("validate", "tumours.yaml")
    assert out.returncode == 0, out.output
    hash_aside = re.compile(r"config hash [0-9a-f]{12}")
    assert hash_aside.sub("config hash H", out.output.strip()) == hash_aside.sub("config hash H", ok)

    mistake = next(line for line in quoted if line.startswith("error: "))
    out = trainflow_in_process("validate", "tumours.yaml", "--set", "data.label_column=diagnosys")
    assert out.returncode == 2
    assert out.output.strip().startswith(mistake.removesuffix("..."))


def test_the_tutorials_commands_exist_with_their_options_and_its_request_is_the_csvs_first_row(tmp_path):
    """Every `trainflow ...` line of the tutorial names a command and options the command
    line has; each `--set` of a run is a field of the config; the curl request holds the
    config's features with the CSV's first row's values."""
    import json
    import shlex

    import yaml

    from trainflow.cli.main import click_command
    from trainflow.config import load_config

    page = DOCS / "tutorial.md"
    make_csv, _ = _blocks(page, "python")
    (config,) = _blocks(page, "yaml")
    (tmp_path / "tumours.yaml").write_text(config)
    lines = [line.strip() for block in _blocks(page, "bash") for line in block.splitlines()]
    commands = [shlex.split(line, comments=True) for line in lines if line.startswith("trainflow ")]
    assert {tuple(words[:2]) for words in commands} >= {
        ("trainflow", "validate"), ("trainflow", "run"), ("trainflow", "models"), ("trainflow", "ui")
    }  # fmt: skip
    for words in commands:
        command, rest = click_command, words[1:]
        while rest and rest[0] in getattr(command, "commands", {}):
            command, rest = command.commands[rest[0]], rest[1:]
        assert not getattr(command, "commands", None), f"{words}: no such command"
        options = {opt for param in command.params for opt in param.opts}
        given = [word.split("=")[0] for word in rest if word.startswith("-")]
        assert set(given) <= options, f"{' '.join(words)}: {set(given) - options} not among {options}"
        if words[1] == "run":
            overrides = [rest[i + 1] for i, word in enumerate(rest) if word == "--set"]
            load_config(tmp_path / rest[0], overrides)  # a field that is not one raises ConfigError

    curl = next(block for block in _blocks(page, "bash") if block.startswith("curl "))
    request = json.loads(re.search(r"-d '(.*)'", curl)[1])
    features = yaml.safe_load(config)["data"]["feature_columns"]
    (row,) = request["rows"]
    assert list(row) == features
    namespace: dict = {}
    exec(make_csv.replace('frame.to_csv("tumours.csv", index=False)', ""), namespace)
    assert row == namespace["frame"].iloc[0][features].to_dict()


def test_every_example_folder_is_a_page_whose_summary_says_what_it_shows_and_how_to_run_it(caplog):
    """The Examples section is made from examples/ when the site builds: each folder's
    README becomes a page, and the overview a section with its first paragraph (a whole
    sentence), its first shell block and its files, every link reaching a file."""
    hooks = _docs_module("hooks")
    folders = sorted(path.name for path in (REPO / "examples").iterdir() if path.is_dir())
    folders = [name for name in folders if not name.startswith((".", "_"))]
    assert hooks.example_pages() == [f"examples/{name}/README.md" for name in folders]
    assert caplog.records == []

    copied = hooks.copied_pages()
    for path in hooks.example_pages():
        summary = hooks.example_summary(path, "examples.md")
        _, first, *rest = summary.split("\n\n")
        assert first.endswith("."), f"{path}: its first paragraph is no whole sentence: {first!r}"
        assert any(part.startswith("```bash\n") for part in rest), (
            f"{path}: no shell block says how to run it"
        )
        for target in hooks.LINK.findall(summary):
            hooks.repository_link(target[1], "examples.md", copied, "https://github.com/trainflow/trainflow")
    assert caplog.records == [], caplog.text
    # What running an example leaves behind is not listed among its files.
    registry, config = REPO / "examples/hf_text/mlflow.db", REPO / "examples/hf_text/texts.yaml"
    assert hooks.ignored([registry, config]) == {registry}


@pytest.mark.slow
def test_the_examples_overview_links_every_examples_page(site):
    hooks = _docs_module("hooks")
    overview = (site / "examples" / "index.html").read_text()
    for path in hooks.example_pages():
        folder = Path(path).parent.name
        assert (site / "examples" / folder / "index.html").is_file(), folder
        assert f'href="{folder}/"' in overview, folder
