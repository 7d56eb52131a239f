"""The config's reference is made from the schema: every field says what it does, the
bundled default config is what the schema writes, and the documentation's page names every
field with its description."""

import html
import re
from pathlib import Path

import yaml

from trainflow.config import PipelineConfig, load_config
from trainflow.config.reference import SAMPLE_COMMAND, field_docs, markdown, sample_yaml
from trainflow.config.sections import Section

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "configs" / "digits.yaml"
FEW_WORDS = 3


def _sections() -> list[type[Section]]:
    found, todo = [], [Section]
    while todo:
        for sub in todo.pop().__subclasses__():
            found.append(sub)
            todo.append(sub)
    return found


def test_every_field_of_the_schema_has_a_description():
    bare = [doc.path for doc in field_docs() if len(doc.description.split()) < FEW_WORDS]
    assert bare == [], f"fields without a description (Field(..., description=...)): {', '.join(bare)}"


def test_every_section_says_what_it_is_in_its_docstring():
    # The reference shows a section's docstring under its heading, and in the sample above it.
    bare = [cls.__name__ for cls in _sections() if len((cls.__doc__ or "").split()) < FEW_WORDS]
    assert bare == [], f"sections without a docstring: {', '.join(bare)}"


def test_the_bundled_default_config_is_what_the_schema_writes():
    assert SAMPLE.read_text() == sample_yaml(), (
        f"configs/digits.yaml differs from what the schema writes; regenerate it: {SAMPLE_COMMAND}"
    )


def test_the_sample_loads_to_the_default_config():
    loaded = load_config(SAMPLE)
    assert loaded == PipelineConfig()
    assert loaded.config_hash() == PipelineConfig().config_hash()
    # Every field is spelled out, sections as nested mappings.
    raw = yaml.safe_load(sample_yaml())
    assert raw == PipelineConfig().model_dump(mode="json")


def test_the_sample_carries_each_description_as_a_comment():
    comments = " ".join(line.split("# ", 1)[1] for line in sample_yaml().splitlines() if "# " in line)
    flat = " ".join(comments.split())
    # A section's fields that have no value in the default (an unset sweep, metrics of one's
    # own) are the reference page's to describe; every other description is in the sample.
    shown = [doc for doc in field_docs() if "<" not in doc.path and not _under_unset(doc.path)]
    missing = [doc.path for doc in shown if doc.description not in flat]
    assert missing == []


def _under_unset(path: str) -> bool:
    value = PipelineConfig().model_dump(mode="json")
    for part in path.split(".")[:-1]:
        value = value.get(part) if isinstance(value, dict) else None
        if value is None:
            return True
    return False


def test_the_reference_page_reads_every_field_and_its_description():
    # As the site renders it: a description's <architecture> or **args is text, not markup.
    import markdown as python_markdown

    rendered = python_markdown.markdown(markdown(), extensions=["tables"])
    text = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", rendered)).split())
    missing = [doc.path for doc in field_docs() if doc.path not in text or doc.description not in text]
    assert missing == []


def test_a_nested_section_shows_the_defaults_its_holder_gives_it():
    docs = {doc.path: doc for doc in field_docs()}
    assert docs["sweep.scaling.num_workers"].default == 1  # a trial's one worker
    assert docs["scaling.num_workers"].default == 2
    # A mapping of sections names its key: a metric of one's own by its name.
    assert "evaluation.metrics.<name>.fn" in docs and "sweep.space.<field>.loguniform" in docs
