"""The config's reference, made from the schema: every field with its type, default,
allowed values and description, as the documentation's page (:func:`markdown`) and as
the bundled default config with its comments (:func:`sample_yaml`). A field added to the
schema appears in both with no other edit.

``python -m trainflow.config.reference > configs/digits.yaml`` writes the default config.
"""

from __future__ import annotations

import math
import textwrap
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

import annotated_types
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from trainflow.config.pipeline import PipelineConfig
from trainflow.config.sections import section_type

# What a key of a mapping of sections stands for in a field's path: evaluation.metrics.<name>.fn.
KEY_NAMES = {"sweep.space": "field"}
KEY_NAME = "name"
SAMPLE_COMMAND = "python -m trainflow.config.reference > configs/digits.yaml"
SAMPLE_HEADER = f"""\
The default job: what `trainflow run` runs with no config. It trains scikit-learn's 8x8
handwritten digits (builtin:digits, bundled: no download) with a small CNN on two Ray Train
workers of half a CPU each. `--set train.lr=0.01` overrides a field; a config of your own
holds only the fields it changes.
Every field is here with its default and what it means. Generated from the schema's
descriptions (the documentation's config reference shows the same), by
  {SAMPLE_COMMAND}"""
WIDTH = 100  # the sample's lines, comments included
COMMENT_COLUMN = 32  # where a short description starts, at the end of its field's line


@dataclass(frozen=True)
class FieldDoc:
    """One field of the config, as its reference shows it."""

    path: str  # dotted, as --set takes it: train.lr; <name> for a key of a mapping of sections
    type: str
    default: Any  # PydanticUndefined for a field each entry must give
    allowed: str  # the values it may take, where the type does not say: "one of adam, sgd", "≥ 1"
    description: str
    section: bool  # a section of fields of its own (data, train.early_stopping)


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        return type(args[0]).__name__ if args else "str"
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if annotation is type(None):
        return "null"
    if annotation is Any:
        return "any"
    if origin is tuple:
        return f"[{', '.join(_type_name(a) for a in args)}]"
    if origin is not None:
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in args)}]"
    if isinstance(annotation, type):
        return "section" if issubclass(annotation, BaseModel) else annotation.__name__
    return str(annotation).replace("typing.", "")


def _allowed(info: FieldInfo) -> str:
    annotation = info.annotation
    choices = [a for a in (annotation, *typing.get_args(annotation)) if typing.get_origin(a) is Literal]
    if choices:
        return "one of " + ", ".join(str(v) for c in choices for v in typing.get_args(c))
    bounds = {
        annotated_types.Ge: "≥", annotated_types.Gt: ">", annotated_types.Le: "≤", annotated_types.Lt: "<",
    }  # fmt: skip
    parts = [
        f"{sign} {getattr(m, attr)}"
        for m in info.metadata
        for kind, sign in bounds.items()
        if isinstance(m, kind)
        for attr in ("ge", "gt", "le", "lt")
        if hasattr(m, attr)
    ]
    return ", ".join(parts)


def _default(info: FieldInfo) -> Any:
    default = info.get_default(call_default_factory=True)
    return default.model_dump(mode="json") if isinstance(default, BaseModel) else default


def _description(info: FieldInfo) -> str:
    """The field's description; a section without one of its own has its class's docstring."""
    section = section_type(info.annotation)
    text = info.description or (section.__doc__ or "" if section is not None else "")
    return " ".join(text.split())


def field_docs(
    model: type[BaseModel] = PipelineConfig, prefix: str = "", defaults: dict[str, Any] | None = None
) -> list[FieldDoc]:
    """Every field of ``model`` and of the sections it holds, in the schema's order.
    ``defaults``: the values the section holding ``model`` gives its fields, where they
    differ from the class's (``sweep.scaling`` has one worker)."""
    docs = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        section = section_type(info.annotation)
        default = (defaults or {}).get(name, _default(info))
        docs.append(
            FieldDoc(
                path=path,
                type=_type_name(info.annotation),
                default=default,
                allowed=_allowed(info),
                description=_description(info),
                section=section is not None,
            )
        )
        if section is None:
            continue
        if typing.get_origin(info.annotation) is dict:
            docs.extend(field_docs(section, f"{path}.<{KEY_NAMES.get(path, KEY_NAME)}>."))
        else:
            docs.extend(field_docs(section, f"{path}.", default if isinstance(default, dict) else None))
    return docs


# Characters that Markdown would read as markup in a description: a description is plain text.
MARKUP = str.maketrans(
    {"&": "&amp;", "<": "&lt;", ">": "&gt;", "|": "\\|", "*": "\\*", "_": "\\_", "[": "\\[", "]": "\\]"}
)


def _text(text: str) -> str:
    """Plain text as a table cell reads it: ``<architecture>``, ``**args`` and ``[c, h, w]``
    stay as written."""
    return text.translate(MARKUP)


def _code(text: str) -> str:
    """``text`` as inline code in a table cell."""
    return f"`{text.replace('|', '&#124;')}`"


def markdown() -> str:
    """The reference page's tables: the top-level fields, then one table per section,
    a row per field (a section inside a section heads its own rows)."""
    groups: dict[str, list[FieldDoc]] = {}
    for doc in field_docs():
        top = doc.path.split(".")[0]
        groups.setdefault(top if "." in doc.path or doc.section else "", []).append(doc)
    out = []
    for top, docs in groups.items():
        head, rows = (docs[0], docs[1:]) if top else (None, docs)
        out.append(f"## `{top}`\n" if top else "## Top level\n")
        if head is not None and head.description:
            out.append(f"{_text(head.description)}\n")
        out.append("| field | type | default | description |\n|---|---|---|---|")
        out.extend(_row(doc) for doc in rows)
        out.append("")
    return "\n".join(out)


def _row(doc: FieldDoc) -> str:
    """A field's row: its path, its type with the values it allows, its default as YAML
    writes it, and its description."""
    if doc.default is PydanticUndefined:  # a field each entry must give (evaluation.metrics.<name>.fn)
        default = "required"
    elif doc.section and isinstance(doc.default, dict) and doc.default:
        default = ""  # its fields' rows say
    else:
        default = _code(_yaml_value(doc.default))
    base = doc.type.removesuffix(" | null")
    kind = doc.allowed if doc.allowed.startswith("one of") else f"{base} {doc.allowed}".strip()
    if base != doc.type:
        kind += " or null"
    return f"| {_code(doc.path)} | {_text(kind)} | {default} | {_text(doc.description)} |"


def _yaml_value(value: Any) -> str:
    """``value`` as one line of YAML (flow style), reading back as the same value."""
    text = yaml.safe_dump(value, default_flow_style=True, width=math.inf, sort_keys=False)
    return text.removesuffix("\n").removesuffix("\n...")


def _comment_lines(text: str, indent: str) -> list[str]:
    """``text`` as comment lines at ``indent``, none longer than WIDTH."""
    prefix = f"{indent}# "
    return textwrap.wrap(
        text,
        WIDTH,
        initial_indent=prefix,
        subsequent_indent=prefix,
        break_long_words=False,
        break_on_hyphens=False,
    )


def _field_lines(name: str, value: Any, description: str, indent: str) -> list[str]:
    """A field's line, its description at the end when it fits there, else above it."""
    line = f"{indent}{name}: {_yaml_value(value)}"
    short = f"{line.ljust(COMMENT_COLUMN - 1)} # {description}"
    if len(short) <= WIDTH and len(line) < COMMENT_COLUMN - 1:
        return [short]
    return [*_comment_lines(description, indent), line]


def _section_lines(model: type[BaseModel], values: dict[str, Any], indent: str) -> list[str]:
    """The fields of one section, as YAML with their descriptions as comments: a section
    inside it as a nested mapping under its docstring, a blank line before each field whose
    description takes lines of its own."""
    lines: list[str] = []
    for name, info in model.model_fields.items():
        value = values[name]
        section = section_type(info.annotation)
        description = _description(info)
        if section is not None and isinstance(value, dict) and typing.get_origin(info.annotation) is not dict:
            block = [*_comment_lines(description, indent), f"{indent}{name}:"]
            block += _section_lines(section, value, indent + "  ")
        else:
            block = _field_lines(name, value, description, indent)
        if lines and block[0].lstrip().startswith("#"):
            lines.append("")
        lines += block
    return lines


def sample_yaml() -> str:
    """The default config as YAML, what ``configs/digits.yaml`` holds: every field with its
    default value and its description as a comment, sections as nested mappings."""
    header = [f"# {line}".rstrip() for line in SAMPLE_HEADER.splitlines()]
    return (
        "\n".join(
            [*header, "", *_section_lines(PipelineConfig, PipelineConfig().model_dump(mode="json"), "")]
        )
        + "\n"
    )


if __name__ == "__main__":
    print(sample_yaml(), end="")
