"""Turn pydantic validation errors into one SpecError that lists every problem with key, value and fix."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from ladder._util.errors import SpecError


def _fix_for(err: dict[str, Any]) -> str:
    kind = err.get("type", "")
    msg = err.get("msg", "")
    if kind == "missing":
        return "this key is required: add it"
    if kind == "extra_forbidden":
        return "unknown key: remove it or check its spelling"
    if kind == "literal_error":
        return msg.replace("Input should be", "use")
    return msg.removeprefix("Value error, ")


def validate_or_raise(model: type[BaseModel], data: dict[str, Any], path: str) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            key = ".".join(str(p) for p in err["loc"])
            value = err.get("input") if err.get("type") != "missing" else "<missing>"
            if isinstance(value, dict):
                value = "{...}"
            problems.append((key or "<root>", value, _fix_for(err)))
        raise SpecError(path, problems) from None


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out
