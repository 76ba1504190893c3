"""Read and check ERLExperiment manifests offline, against the CRD itself.

The CRD in `crds/` is the one schema. This module reads it and applies what
the API server would: defaults, the structural OpenAPI schema (with unknown
fields refused, as `kubectl apply` does by default) and the CEL rules in
`x-kubernetes-validations`. Rules that compare with the old object
(`oldSelf`) only apply to updates and are skipped here. Every error names the
field path it is about, so `evokube validate` can report all of them at once.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import yaml
from celpy import celtypes

API_VERSION = "evokube.io/v1alpha1"
KIND = "ERLExperiment"
CRD_FILE = "erlexperiments.evokube.io.yaml"


@dataclass(frozen=True)
class FieldError:
    """One problem with a manifest, at a dotted field path such as spec.population.size."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class ManifestError(ValueError):
    """A manifest that must not run; carries every FieldError found."""

    def __init__(self, errors: list[FieldError], source: str = "manifest"):
        self.errors = errors
        lines = "\n".join(f"  {e}" for e in errors)
        super().__init__(f"{source} is invalid ({len(errors)} error(s)):\n{lines}")


def crd_path() -> Path:
    """The CRD file: packaged with the wheel, or crds/ of a source checkout."""
    packaged = Path(__file__).resolve().parents[1] / "crds" / CRD_FILE
    if packaged.exists():
        return packaged
    return Path(__file__).resolve().parents[3] / "crds" / CRD_FILE


@functools.cache
def crd_schema() -> dict:
    """The openAPIV3Schema of the served version."""
    crd = yaml.safe_load(crd_path().read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    return version["schema"]["openAPIV3Schema"]


# -- defaults ----------------------------------------------------------------
def apply_defaults(value: Any, schema: dict) -> Any:
    """Fill unset fields with the schema's defaults, as the API server does."""
    if isinstance(value, dict) and "properties" in schema:
        for name, sub in schema["properties"].items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                value[name] = apply_defaults(value[name], sub)
    elif isinstance(value, list) and "items" in schema:
        value[:] = [apply_defaults(v, schema["items"]) for v in value]
    return value


# -- structural schema -------------------------------------------------------
def _to_jsonschema(schema: dict) -> dict:
    """OpenAPI v3 (Kubernetes flavour) to JSON Schema draft 4, unknown fields refused."""
    out = {k: v for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    out.pop("default", None)
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("anyOf", None)
        out["type"] = ["integer", "string"]
    if "properties" in schema:
        out["properties"] = {k: _to_jsonschema(v) for k, v in schema["properties"].items()}
        if not schema.get("x-kubernetes-preserve-unknown-fields"):
            out.setdefault("additionalProperties", False)
    if isinstance(schema.get("additionalProperties"), dict):
        out["additionalProperties"] = _to_jsonschema(schema["additionalProperties"])
    if "items" in schema:
        out["items"] = _to_jsonschema(schema["items"])
    return out


def _dotted(parts) -> str:
    path = ""
    for p in parts:
        path += f"[{p}]" if isinstance(p, int) else (f".{p}" if path else str(p))
    return path or "(root)"


def _schema_errors(manifest: dict) -> list[FieldError]:
    schema = _to_jsonschema(crd_schema())
    # The API server owns ObjectMeta (namespace, labels, ...); the CRD only narrows `name`.
    schema["properties"]["metadata"]["additionalProperties"] = True
    validator = jsonschema.Draft4Validator(schema)
    errors = []
    for err in validator.iter_errors(manifest):
        path = list(err.absolute_path)
        if err.validator == "additionalProperties":
            allowed = set(err.schema.get("properties", {}))
            for extra in sorted(set(err.instance) - allowed):
                errors.append(FieldError(_dotted([*path, extra]), "unknown field"))
            continue
        if err.validator == "required":
            missing = re.search(r"'([^']+)' is a required property", err.message)
            if missing:
                errors.append(FieldError(_dotted([*path, missing.group(1)]), "required"))
                continue
        errors.append(FieldError(_dotted(path), err.message))
    return errors


# -- CEL rules ---------------------------------------------------------------
def _cel_split(text: celtypes.StringType, sep: celtypes.StringType) -> celtypes.ListType:
    """Kubernetes' strings extension: 'a,b'.split(',')."""
    return celtypes.ListType([celtypes.StringType(s) for s in str(text).split(str(sep))])


_CEL = celpy.Environment()
_CEL_FUNCTIONS: dict[str, Any] = {"split": _cel_split}


@functools.cache
def _cel_program(rule: str):
    return _CEL.program(_CEL.compile(rule), functions=_CEL_FUNCTIONS)


def _rules(value: Any, schema: dict, path: list) -> Iterator[tuple[list, dict, Any]]:
    """Every (path, rule, value) the manifest's present fields are subject to."""
    for rule in schema.get("x-kubernetes-validations", []):
        yield path, rule, value
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                yield from _rules(value[name], sub, [*path, name])
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            yield from _rules(item, schema["items"], [*path, i])


def _cel_errors(manifest: dict) -> list[FieldError]:
    errors = []
    for path, rule, value in _rules(manifest, crd_schema(), []):
        if "oldSelf" in rule["rule"]:
            continue  # transition rules only apply to updates
        try:
            result = _cel_program(rule["rule"]).evaluate({"self": celpy.json_to_cel(value)})
        except celpy.CELEvalError as err:
            result = err
        if isinstance(result, celpy.CELEvalError):
            message = f"rule {rule['rule']!r} could not be evaluated: {result.args[0]}"
        elif bool(result):
            continue
        else:
            message = rule.get("message") or f"failed rule: {rule['rule']}"
        field = rule.get("fieldPath", "").lstrip(".").split(".") if rule.get("fieldPath") else []
        errors.append(FieldError(_dotted([*path, *field]), message))
    return errors


# -- entry points ------------------------------------------------------------
def _header_errors(manifest: Any) -> list[FieldError]:
    if not isinstance(manifest, dict):
        return [FieldError("(root)", "a manifest must be a YAML mapping")]
    errors = []
    if manifest.get("apiVersion") != API_VERSION:
        errors.append(FieldError("apiVersion", f"must be {API_VERSION}"))
    if manifest.get("kind") != KIND:
        errors.append(FieldError("kind", f"must be {KIND}"))
    if not (manifest.get("metadata") or {}).get("name"):
        errors.append(FieldError("metadata.name", "required"))  # its format is in the CRD
    return errors


def check(manifest: Any) -> tuple[dict, list[FieldError]]:
    """Default and validate a parsed manifest; returns (defaulted copy, errors)."""
    errors = _header_errors(manifest)
    if not isinstance(manifest, dict):
        return {}, errors
    defaulted = apply_defaults(copy.deepcopy(manifest), crd_schema())
    schema_errors = _schema_errors(defaulted)
    errors += [e for e in schema_errors if e not in errors]
    if not schema_errors:  # CEL rules assume a well-typed object, as on the server
        errors += _cel_errors(defaulted)
    return defaulted, errors


def load(path: str | Path) -> dict:
    """Read, default and validate a manifest file; raise ManifestError listing every error."""
    path = Path(path)
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except FileNotFoundError:
        raise ManifestError([FieldError("(file)", f"{path} does not exist")], str(path)) from None
    except yaml.YAMLError as err:
        raise ManifestError([FieldError("(file)", f"not valid YAML: {err}")], str(path)) from None
    if len(docs) != 1:
        raise ManifestError(
            [FieldError("(file)", f"expected one ERLExperiment document, found {len(docs)}")],
            str(path),
        )
    manifest, errors = check(docs[0])
    if errors:
        raise ManifestError(errors, str(path))
    return manifest
