"""The largest ERLExperiment spec and status the CRD admits, in characters of compact JSON.

An upper bound read off the schema alone: every list at its maxItems, every map at its
maxProperties (keys at the length a `size(k) <= N` rule allows), every string at its
maxLength, every number at 24 characters. Of properties that a rule makes exclusive
("exactly one of", "a != b") only the largest counts, and a property a rule refuses outright
(`!has(self.x)`, or an empty list only) counts as absent. A string without a pattern may hold
characters JSON escapes (`<` is `\\u003c` as the API server writes it): `free_text` is the
characters each of its characters may take once encoded (1: as the operator holds it in memory).
"""

from __future__ import annotations

import json
import re

NUMBER = 24  # -1.2345678901234567e+308
INTEGER = 20  # -9223372036854775808
DATE_TIME = 64


class Unbounded(ValueError):
    """A list, map or string of the schema has no upper bound."""


def _key_bound(schema: dict) -> int | None:
    for rule in schema.get("x-kubernetes-validations", []):
        found = re.search(r"size\(k\) <= (\d+)", rule["rule"])
        if found:
            return int(found.group(1))
    return None


def _absent(schema: dict) -> set[str]:
    """Properties a rule of `schema` refuses whenever they are set (or not empty)."""
    names = set()
    for rule in schema.get("x-kubernetes-validations", []):
        text = rule["rule"]
        found = re.fullmatch(r"!has\(self\.(\w+)\)", text) or re.fullmatch(
            r"!has\(self\.(\w+)\) \|\| size\(self\.\1\) == 0", text
        )
        if found:
            names.add(found.group(1))
    return names


def _exclusive(schema: dict) -> list[set[str]]:
    """Groups of properties of which a rule of `schema` admits at most one."""
    groups = []
    for rule in schema.get("x-kubernetes-validations", []):
        text = rule["rule"]
        if re.fullmatch(r"has\(self\.\w+\) != has\(self\.\w+\)", text) or re.search(
            r"\) == 1$", text
        ):
            groups.append(set(re.findall(r"has\(self\.(\w+)\)", text)))
    return groups


def largest(schema: dict, path: str = "", free_text: int = 1) -> int:
    """Characters of the largest compact JSON value `schema` admits; Unbounded names a field
    without a bound."""
    if "enum" in schema:
        return max(len(json.dumps(v)) for v in schema["enum"])
    kind = schema.get("type")
    if schema.get("x-kubernetes-int-or-string"):
        return max(INTEGER, _string(schema, path, free_text))
    if kind == "string":
        return _string(schema, path, free_text)
    if kind in ("integer", "number", "boolean"):
        return {"integer": INTEGER, "number": NUMBER, "boolean": 5}[kind]
    if kind == "array":
        if "maxItems" not in schema:
            raise Unbounded(f"{path}: a list without maxItems")
        item = largest(schema["items"], f"{path}[*]", free_text)
        return 2 + schema["maxItems"] * (item + 1)
    if kind == "object":
        return _object(schema, path, free_text)
    raise Unbounded(f"{path}: no type")


def _string(schema: dict, path: str, free_text: int) -> int:
    if "maxLength" not in schema:
        raise Unbounded(f"{path}: a string without maxLength")
    return 2 + schema["maxLength"] * (1 if "pattern" in schema else free_text)


def _object(schema: dict, path: str, free_text: int) -> int:
    absent = _absent(schema)
    fields = {
        name: len(name) + 4 + largest(sub, f"{path}.{name}", free_text)
        for name, sub in (schema.get("properties") or {}).items()
        if name not in absent
    }
    total = 2 + sum(fields.values())
    for group in _exclusive(schema):
        sizes = sorted((fields.get(name, 0) for name in group), reverse=True)
        total -= sum(sizes[1:])  # only the largest of the group can be there
    values = schema.get("additionalProperties")
    if isinstance(values, dict):
        keys = _key_bound(schema)
        if "maxProperties" not in schema or keys is None:
            raise Unbounded(f"{path}: a map without maxProperties or a size(k) <= N key rule")
        total += schema["maxProperties"] * (keys + 4 + largest(values, f"{path}.*", free_text))
    return total
