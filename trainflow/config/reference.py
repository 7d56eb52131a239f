"""The config's reference, made from the schema: every field with its type, default,
allowed values and description, as the documentation's page (:func:`markdown`) and as
the bundled sample config's comments (:func:`sample_yaml`). A field added to the schema
appears in both with no other edit."""

from __future__ import annotations

import json
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from trainflow.config.schema import PipelineConfig


@dataclass(frozen=True)
class FieldDoc:
    """One field of the config, as its reference shows it."""

    path: str  # dotted, as --set takes it: train.lr
    type: str
    default: Any
    allowed: str  # the values it may take, where the type does not say: "one of adam, sgd", "≥ 1"
    description: str
    section: bool  # a section of fields of its own (data, train.early_stopping)


def _section_class(annotation: Any) -> type[BaseModel] | None:
    """The config section a field holds (a pydantic model, possibly optional), if any."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _type_name(annotation: Any) -> str:
    if typing.get_origin(annotation) is Literal:
        values = typing.get_args(annotation)
        return type(values[0]).__name__ if values else "str"
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and not typing.get_args(annotation):
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


def field_docs(model: type[BaseModel] = PipelineConfig, prefix: str = "") -> list[FieldDoc]:
    """Every field of ``model`` and of the sections it holds, in the schema's order."""
    docs = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        section = _section_class(info.annotation)
        description = info.description or (section.__doc__ or "" if section else "")
        docs.append(
            FieldDoc(
                path=path,
                type=_type_name(info.annotation),
                default=_default(info),
                allowed=_allowed(info),
                description=" ".join(description.split()),
                section=section is not None,
            )
        )
        if section is not None:
            docs.extend(field_docs(section, f"{path}."))
    return docs


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


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
            out.append(f"{head.description}\n")
        out.append("| field | type | default | allowed | description |\n|---|---|---|---|---|")
        out.extend(_row(doc) for doc in rows)
        out.append("")
    return "\n".join(out)


def _row(doc: FieldDoc) -> str:
    if doc.section:
        default = ""
    elif doc.default is PydanticUndefined:  # a field each entry must give (evaluation.metrics.<name>.fn)
        default = "required"
    else:
        default = f"`{json.dumps(doc.default)}`"
    return (
        f"| `{doc.path}` | {_cell(doc.type)} | {_cell(default)} | {_cell(doc.allowed)} | "
        f"{_cell(doc.description)} |"
    )
