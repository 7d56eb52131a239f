"""ConfigError, and the one-line message it carries for what pydantic refuses."""

from __future__ import annotations

from pydantic import BaseModel, ValidationError


class ConfigError(ValueError):
    """A config that cannot run; the message names the field and what would be valid."""


def validation_message(err: ValidationError, root: type[BaseModel]) -> str:
    """Every error of ``err`` on one line, each named by its dotted field; an unknown key
    lists the valid keys of its section, found from ``root``, the model validated."""
    parts = []
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"]) or "config"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            parent = e["loc"][:-1]
            model: type[BaseModel] = root
            for p in parent:
                model = model.model_fields[str(p)].annotation  # type: ignore[assignment]
            known = ", ".join(model.model_fields) if isinstance(model, type) else ""
            msg = f"unknown key; valid keys here: {known}"
        elif not e["loc"]:  # a rule across sections: the message names its fields
            parts.append(msg)
            continue
        elif "input" in e and not isinstance(e["input"], (dict, list)) and repr(e["input"]) not in msg:
            msg = f"{msg} (got {e['input']!r})"
        parts.append(f"{field}: {msg}")
    return "invalid config: " + "; ".join(parts)
