"""Read and check ERLExperiment manifests (and ERLSweep ones) offline, against the CRD itself.

The CRD in `crds/` is the one schema. This module reads it and applies what
the API server would: defaults, the structural OpenAPI schema (with unknown
fields refused, as `kubectl apply` does by default) and the CEL rules in
`x-kubernetes-validations`. Rules that compare with the old object
(`oldSelf`) only apply to updates and are skipped here. Every error names the
field path it is about, so `evokube validate` can report all of them at once.

Where Python and the API server (Go) differ, this module follows Go: regular
expressions (`pattern`, CEL `matches()`) have RE2's meaning of `$` (end of
text, not before a final newline) and ASCII classes, and CEL's Kubernetes
`quantity()` library is implemented here with `resource.Quantity` semantics.
Manifest files are hostile input: their size, nesting and YAML features are
bounded before anything is built from them, and every problem with a file is
reported as an error on `(file)`, never raised.
"""

from __future__ import annotations

import copy
import functools
import math
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, ClassVar

import celpy
import jsonschema
import yaml
from celpy import celtypes

from evokube_contract import API_VERSION

CRD_FILE = "erlexperiments.evokube.io.yaml"
SWEEP_CRD_FILE = "erlsweeps.evokube.io.yaml"  # an ERLSweep's own fields (laptop/sweep.py)
MAX_FILE_BYTES = 1 << 20  # a manifest is a few KiB
MAX_DEPTH = 32  # nesting of mappings and sequences; the deepest field (affinity) needs 11
MAX_REPORTED = 50  # errors listed per file
MAX_SHOWN = 120  # characters of a value or message shown in an error


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
        lines = [f"  {e}" for e in errors[:MAX_REPORTED]]
        if len(errors) > MAX_REPORTED:
            lines.append(f"  ... and {len(errors) - MAX_REPORTED} more")
        super().__init__(f"{source} is invalid ({len(errors)} error(s)):\n" + "\n".join(lines))


def shorten(text: str, limit: int = MAX_SHOWN) -> str:
    """`text` cut to `limit` characters, so no message grows with the value it is about."""
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def crd_path(crd_file: str = CRD_FILE) -> Path:
    """A CRD file: packaged with the wheel, or crds/ of a source checkout."""
    packaged = Path(__file__).resolve().parents[1] / "crds" / crd_file
    if packaged.exists():
        return packaged
    return Path(__file__).resolve().parents[3] / "crds" / crd_file


@functools.cache
def _crd(crd_file: str) -> tuple[str, dict]:
    crd = yaml.safe_load(crd_path(crd_file).read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    return crd["spec"]["names"]["kind"], version["schema"]["openAPIV3Schema"]


def crd_schema(crd_file: str = CRD_FILE) -> dict:
    """The openAPIV3Schema of the served version."""
    return _crd(crd_file)[1]


# -- Go (RE2) regular expressions ---------------------------------------------
@functools.cache
def go_regex(pattern: str) -> re.Pattern:
    """`pattern` compiled with Go's meaning: `$` is the end of the text, classes are ASCII."""
    out, in_class, escaped = [], False, False
    for char in pattern:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "[":
            in_class = True
        elif char == "]":
            in_class = False
        elif char == "$" and not in_class:
            char = r"\Z"
        out.append(char)
    return re.compile("".join(out), re.ASCII)


# -- Kubernetes quantities (CEL's quantity library) -----------------------------
_QUANTITY = re.compile(
    r"([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?\Z",
    re.ASCII,
)
_DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15}
_DECIMAL_SUFFIXES["E"] = 18
_BINARY_SUFFIXES = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_MAX_EXPONENT = 1000  # resource.Quantity's own limit is int32; this keeps Fraction arithmetic small
_INT64_MAX = 2**63 - 1


class Quantity(Fraction):
    """A resource.Quantity's value: exact, non-zero magnitudes rounded up to a multiple of 1n,
    binary-suffixed magnitudes capped at 2^63-1, as ParseQuantity does."""


def parse_quantity(text: str) -> Quantity | None:
    """The value of a Kubernetes quantity string, or None where ParseQuantity fails."""
    match = _QUANTITY.match(text)
    if not match:
        return None
    sign, number, suffix = match.group(1), match.group(2), match.group(3) or ""
    value = Fraction(number)
    if suffix in _BINARY_SUFFIXES:
        value *= 2 ** _BINARY_SUFFIXES[suffix]
        value = min(value, Fraction(_INT64_MAX))
    else:
        exponent = _DECIMAL_SUFFIXES.get(suffix)
        if exponent is None:
            exponent = int(suffix[1:])
            if abs(exponent) > _MAX_EXPONENT:
                return None
        value *= Fraction(10) ** exponent
    value = Fraction(math.ceil(value * 10**9), 10**9)
    return Quantity(-value if sign == "-" else value)


def _cel_is_quantity(text: celtypes.StringType) -> celtypes.BoolType:
    return celtypes.BoolType(parse_quantity(str(text)) is not None)


def _cel_quantity(text: celtypes.StringType) -> Quantity:
    value = parse_quantity(str(text))
    if value is None:
        raise ValueError(f"invalid quantity {shorten(str(text))!r}")
    return value


def _cel_compare_to(a: Quantity, b: Quantity) -> celtypes.IntType:
    return celtypes.IntType((a > b) - (a < b))


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


def _go_pattern(validator, pattern, instance, schema):
    """jsonschema's `pattern` keyword with Go's regular expressions."""
    if validator.is_type(instance, "string") and not go_regex(pattern).search(instance):
        yield jsonschema.ValidationError(f"{shorten(repr(instance))} does not match {pattern!r}")


def _is_integer(checker, instance) -> bool:
    """An int64, as the API server decodes it: 8.0 is 8, and 2**63 is no integer at all."""
    if isinstance(instance, bool) or not isinstance(instance, int | float):
        return False
    return float(instance).is_integer() and -(2**63) <= instance < 2**63


_Validator = jsonschema.validators.extend(
    jsonschema.Draft4Validator,
    {"pattern": _go_pattern},
    type_checker=jsonschema.Draft4Validator.TYPE_CHECKER.redefine("integer", _is_integer),
)


def _dotted(parts) -> str:
    path = ""
    for p in parts:
        path += f"[{p}]" if isinstance(p, int) else (f".{p}" if path else str(p))
    return path or "(root)"


# Schema errors after which the API server skips the CEL rules ("some validation rules were not
# checked because the object was invalid"): its NotSupported, Required, TooLong, TooMany and
# TypeInvalid field errors. After the others (pattern, minimum, ...) the rules still run.
_BLOCKING = frozenset({"enum", "required", "maxLength", "maxItems", "maxProperties", "type"})


def _schema_errors(manifest: dict, crd_file: str) -> tuple[list[FieldError], bool]:
    """The schema's errors, and whether any of them stops the API server running CEL rules."""
    schema = _to_jsonschema(crd_schema(crd_file))
    # The API server owns ObjectMeta (namespace, labels, ...); the CRD only narrows `name`.
    schema["properties"]["metadata"]["additionalProperties"] = True
    errors, blocking = [], False
    for err in _Validator(schema).iter_errors(manifest):
        blocking = blocking or err.validator in _BLOCKING
        path = list(err.absolute_path)
        if err.validator == "additionalProperties":
            allowed = set(err.schema.get("properties", {}))
            for extra in sorted(set(err.instance) - allowed):
                errors.append(FieldError(_dotted([*path, shorten(extra)]), "unknown field"))
            continue
        if err.validator == "required":
            missing = re.search(r"'([^']+)' is a required property", err.message)
            if missing:
                errors.append(FieldError(_dotted([*path, missing.group(1)]), "required"))
                continue
        errors.append(FieldError(_dotted(path), shorten(err.message, 300)))
    return errors, blocking


# -- CEL rules ---------------------------------------------------------------
def _cel_split(text: celtypes.StringType, sep: celtypes.StringType) -> celtypes.ListType:
    """Kubernetes' strings extension: 'a,b'.split(',')."""
    return celtypes.ListType([celtypes.StringType(s) for s in str(text).split(str(sep))])


def _cel_matches(text: celtypes.StringType, pattern: celtypes.StringType) -> celtypes.BoolType:
    return celtypes.BoolType(go_regex(str(pattern)).search(str(text)) is not None)


_CEL = celpy.Environment()
_CEL_FUNCTIONS: dict[str, Any] = {
    "split": _cel_split,
    "matches": _cel_matches,
    "isQuantity": _cel_is_quantity,
    "quantity": _cel_quantity,
    "compareTo": _cel_compare_to,
}


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


def _cel_errors(manifest: dict, crd_file: str) -> list[FieldError]:
    errors = []
    schema = crd_schema(crd_file)
    # The API server's CEL sees a number field's 1 as the double 1.0 (`low > 0.0` holds).
    doubled = _numbers_as(copy.deepcopy(manifest), schema, "number", float)
    for path, rule, value in _rules(doubled, schema, []):
        if "oldSelf" in rule["rule"]:
            continue  # transition rules only apply to updates
        try:
            result = _cel_program(rule["rule"]).evaluate({"self": celpy.json_to_cel(value)})
        except Exception as err:  # celpy lets some errors of the functions it calls through
            result = celpy.CELEvalError(str(err))
        if isinstance(result, celpy.CELEvalError):
            # The API server reports an evaluation error on the rule's own object.
            reason = shorten(str(result.args[0]))
            message = f"rule {rule['rule']!r} could not be evaluated: {reason}"
            errors.append(FieldError(_dotted(path), message))
            continue
        if bool(result):
            continue
        field = rule.get("fieldPath", "").lstrip(".").split(".") if rule.get("fieldPath") else []
        message = rule.get("message") or f"failed rule: {rule['rule']}"
        errors.append(FieldError(_dotted([*path, *field]), message))
    return errors


# -- entry points ------------------------------------------------------------
def _json_errors(value: Any, path: list) -> Iterator[FieldError]:
    """What JSON (and so the API server) cannot carry: non-string keys, NaN and infinities."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                yield FieldError(_dotted(path), f"keys must be strings, got {shorten(repr(key))}")
            else:
                yield from _json_errors(item, [*path, key])
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _json_errors(item, [*path, i])
    elif isinstance(value, float) and not math.isfinite(value):
        yield FieldError(_dotted(path), f"{value} is not a JSON number")


def _drop_nulls(value: Any) -> Any:
    """The API server drops null fields (and null map values) before defaulting; list items stay."""
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def _numbers_as(value: Any, schema: dict, kind: str, convert: type) -> Any:
    """`value` with the numbers of its `kind` ("integer", "number") fields converted."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return convert(value) if schema.get("type") == kind else value
    if isinstance(value, dict):
        properties, extra = schema.get("properties", {}), schema.get("additionalProperties")
        for name, item in value.items():
            sub = properties.get(name, extra if isinstance(extra, dict) else {})
            value[name] = _numbers_as(item, sub, kind, convert)
    elif isinstance(value, list):
        value[:] = [_numbers_as(v, schema.get("items", {}), kind, convert) for v in value]
    return value


def _integral(value: Any, schema: dict) -> Any:
    """Integer fields as ints (the trainer counts with them): 8.0 becomes 8."""
    return _numbers_as(value, schema, "integer", int)


# ObjectMeta's own rules, which the API server checks before the CRD's.
_QUALIFIED_NAME = go_regex(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_LABEL_VALUE = go_regex(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")


def _is_qualified_name(key: Any) -> bool:
    return (
        isinstance(key, str)
        and len(key.rpartition("/")[0]) <= 253
        and _QUALIFIED_NAME.search(key) is not None
    )


def _metadata_errors(metadata: Any) -> list[FieldError]:
    if not isinstance(metadata, dict):
        return []  # the schema says so
    errors = []
    labels, annotations = metadata.get("labels") or {}, metadata.get("annotations") or {}
    if not isinstance(labels, dict) or not all(
        _is_qualified_name(k) and isinstance(v, str) and _LABEL_VALUE.search(v)
        for k, v in labels.items()
    ):
        errors.append(FieldError("metadata.labels", "label keys and values must be valid"))
    if not isinstance(annotations, dict) or not all(
        _is_qualified_name(k) and isinstance(v, str) for k, v in annotations.items()
    ):
        errors.append(FieldError("metadata.annotations", "annotation keys must be qualified names"))
    return errors


def _header_errors(manifest: Any, kind: str) -> list[FieldError]:
    if not isinstance(manifest, dict):
        return [FieldError("(root)", "a manifest must be a YAML mapping")]
    errors = []
    if manifest.get("apiVersion") != API_VERSION:
        errors.append(FieldError("apiVersion", f"must be {API_VERSION}"))
    if manifest.get("kind") != kind:
        errors.append(FieldError("kind", f"must be {kind}"))
    if not (manifest.get("metadata") or {}).get("name"):
        errors.append(FieldError("metadata.name", "required"))  # its format is in the CRD
    return errors + _metadata_errors(manifest.get("metadata"))


def check(manifest: Any, crd_file: str = CRD_FILE) -> tuple[dict, list[FieldError]]:
    """Default and validate a parsed manifest against the CRD `crd_file` (an ERLExperiment's
    unless told); returns (defaulted copy, errors)."""
    kind, schema = _crd(crd_file)
    errors = _header_errors(manifest, kind)
    if not isinstance(manifest, dict):
        return {}, errors
    json_errors = list(_json_errors(manifest, []))
    if json_errors:
        return {}, errors + json_errors
    defaulted = apply_defaults(_drop_nulls(manifest), schema)
    schema_errors, blocking = _schema_errors(defaulted, crd_file)
    errors += [e for e in schema_errors if e not in errors]
    if not blocking:  # as on the API server, CEL rules need a well-typed, bounded object
        errors += _cel_errors(defaulted, crd_file)
    return _integral(defaulted, schema), errors


class _Loader(yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader):  # type: ignore[misc]
    """The safe loader, with timestamps left as strings (as kubectl sends them)."""

    yaml_implicit_resolvers: ClassVar[dict] = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }


def _check_events(text: str) -> None:
    """Refuse anchors, aliases (billion laughs), deep nesting and duplicate keys (which kubectl
    refuses too) before building any object."""
    # One entry per open collection: the keys seen so far (None for a sequence) and whether
    # the next node of a mapping is a key.
    open_collections: list[list] = []
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise ValueError("YAML anchors and aliases are not supported in manifests")
        if isinstance(event, yaml.CollectionEndEvent):
            open_collections.pop()
            continue
        if not isinstance(event, yaml.NodeEvent):
            continue  # stream and document boundaries
        if open_collections and open_collections[-1][0] is not None:
            keys, is_key = open_collections[-1][0], open_collections[-1][1]
            open_collections[-1][1] = not is_key
            if is_key and isinstance(event, yaml.ScalarEvent):
                if event.value in keys:
                    line = event.start_mark.line + 1
                    raise ValueError(f"duplicate key {shorten(repr(event.value))} on line {line}")
                keys.add(event.value)
        if isinstance(event, yaml.CollectionStartEvent):
            if len(open_collections) == MAX_DEPTH:
                raise ValueError(f"exceeds the maximum nesting depth of {MAX_DEPTH}")
            is_mapping = isinstance(event, yaml.MappingStartEvent)
            open_collections.append([set() if is_mapping else None, True])


def _read_text(path: Path) -> str:
    """The file's text, read only if it is a regular file of at most MAX_FILE_BYTES of UTF-8.

    Opened without blocking, so that a named pipe with no writer is refused at once rather
    than waited on forever (a regular file reads the same either way)."""
    try:
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                raise ValueError("not a regular file")
            data = file.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise ValueError(f"{shorten(str(path))} does not exist") from None
    except IsADirectoryError:
        raise ValueError("not a regular file") from None
    except OSError as err:
        raise ValueError(f"cannot be read: {err.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"larger than {MAX_FILE_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"not UTF-8 text (byte {err.start})") from None


def read(path: str | Path) -> list[Any]:
    """The YAML documents of a manifest file; ManifestError on (file) for any problem reading it."""
    try:
        text = _read_text(Path(path))
        _check_events(text)
        return [d for d in yaml.load_all(text, Loader=_Loader) if d is not None]
    except yaml.YAMLError as err:
        problem = f"not valid YAML: {shorten(str(err).replace(chr(10), ' '), 200)}"
    except (ValueError, TypeError, RecursionError, MemoryError) as err:
        problem = shorten(str(err), 200)
    raise ManifestError([FieldError("(file)", problem)], shorten(str(path)))


def load(path: str | Path, crd_file: str = CRD_FILE) -> dict:
    """Read, default and validate a manifest file (of the CRD `crd_file`'s kind); raise
    ManifestError listing every error."""
    docs = read(path)
    if len(docs) != 1:
        kind = _crd(crd_file)[0]
        raise ManifestError(
            [FieldError("(file)", f"expected one {kind} document, found {len(docs)}")],
            shorten(str(path)),
        )
    manifest, errors = check(docs[0], crd_file)
    if errors:
        raise ManifestError(errors, shorten(str(path)))
    return manifest
