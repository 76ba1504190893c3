"""Checkpoint locations on object storage: `gs://bucket/prefix` and `s3://bucket/prefix`.

Orbax writes a checkpoint's arrays with TensorStore's own bucket drivers (`gcs`, `s3`) and
its folders, metadata and commit markers through etils epath, which hands `gs://` to gcsfs
and `s3://` to s3fs (fsspec). The JAX compilation cache goes through epath too. So a bucket
location needs both halves to reach the same endpoint; `prepare` sees to that:

* emulators: the clients honour `STORAGE_EMULATOR_HOST` (gcsfs) and `AWS_ENDPOINT_URL`
  (s3fs); TensorStore's gcs driver reads `TENSORSTORE_GCS_HTTP_URL` instead, set from the
  former when unset, and its s3 driver is given the endpoint in its spec;
* Orbax 0.12 lists `s3://` among remote prefixes but builds a local `file` kvstore from it
  (it keeps only `gs://` intact): `_teach_orbax_s3` maps `s3://` onto TensorStore's `s3`
  driver, in the three private functions that decide it (tests/objectstore pin them);
* a probe object is written and deleted, so a bad location fails at start-up with one
  clear line and the right exit code (docs/trainer-design.md, "Object storage"):

  - the library is missing (an image without gcsfs/s3fs) or the bucket does not exist:
    `PermanentError` (78): every restart would fail the same way;
  - access denied (403, no credentials for the bucket): `PermanentError` (78), the
    service account or its IAM binding must be fixed;
  - anything else (connection refused, timeouts, 5xx): `RetriableError` (75), since a
    flaky network may recover by the next attempt.
"""

from __future__ import annotations

import functools
import importlib
import os
import uuid
from urllib import parse

from evokube_trainer.runtime import exitcodes

# URL scheme -> the fsspec implementation epath needs for it.
LIBRARIES = {"gs": "gcsfs", "s3": "s3fs"}


def is_url(location: str) -> bool:
    """Whether `location` names a bucket (gs://, s3://) rather than a path."""
    return parse.urlparse(location).scheme in LIBRARIES


def prepare(location: str) -> None:
    """Make the bucket `location` usable by Orbax, epath and JAX's cache; raise PermanentError
    or RetriableError (see the module docstring) when it is not. Paths are left alone."""
    if not is_url(location):
        return
    scheme = parse.urlparse(location).scheme
    library = LIBRARIES[scheme]
    try:
        importlib.import_module(library)
    except ImportError as err:
        raise exitcodes.PermanentError(
            f"spec.checkpoint.location: {location} needs the Python package {library}, "
            "which this image lacks (install evokube[trainer])"
        ) from err
    _point_tensorstore_at_emulators()
    if scheme == "s3":
        _teach_orbax_s3()
    probe(location)


def atomicity_options(location: str):
    """How Orbax marks a checkpoint complete: in a bucket by a commit file written last (a
    bucket cannot rename a folder; Orbax already does this for gs://, not for s3://);
    on a path, Orbax's default (an atomic rename)."""
    import orbax.checkpoint as ocp

    if not is_url(location):
        return None
    return ocp.options.AtomicityOptions(mode=ocp.options.AtomicityMode.COMMIT_FILE)


def probe(location: str) -> None:
    """Write and delete one small object under `location`, classifying any failure."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(location)
    bucket = root.split("/", 1)[0]
    name = f"{root.rstrip('/')}/.evokube-probe-{uuid.uuid4().hex}"
    try:
        fs.pipe_file(name, b"")
        fs.rm_file(name)
    except PermissionError as err:
        raise exitcodes.PermanentError(
            f"spec.checkpoint.location: access to {location} denied ({err}): grant the pod's "
            "service account write access to the bucket"
        ) from err
    except FileNotFoundError as err:
        raise exitcodes.PermanentError(
            f"spec.checkpoint.location: bucket {bucket!r} of {location} does not exist"
        ) from err
    except Exception as err:
        raise exitcodes.RetriableError(
            f"spec.checkpoint.location: cannot reach {location}: {type(err).__name__}: {err}"
        ) from err


def _point_tensorstore_at_emulators() -> None:
    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    if emulator and "TENSORSTORE_GCS_HTTP_URL" not in os.environ:
        if "://" not in emulator:
            emulator = f"http://{emulator}"
        os.environ["TENSORSTORE_GCS_HTTP_URL"] = emulator


def _s3_kvstore(url: str) -> dict:
    """TensorStore's s3 driver spec for `s3://bucket/path`, at AWS_ENDPOINT_URL when set."""
    parsed = parse.urlparse(url)
    spec = {"driver": "s3", "bucket": parsed.netloc, "path": parsed.path.lstrip("/")}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        spec["endpoint"] = endpoint
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        spec["aws_region"] = region
    return spec


@functools.cache
def _teach_orbax_s3() -> None:
    """Route Orbax's array writes for s3:// through TensorStore's s3 driver (once)."""
    from orbax.checkpoint._src.path import gcs_utils
    from orbax.checkpoint._src.serialization import tensorstore_utils

    normalize = tensorstore_utils._normalize_path
    use_remote = tensorstore_utils._use_gcs_driver
    gcs_kvstore = gcs_utils.get_kvstore_for_gcs

    def normalize_keeping_s3(path: str) -> str:
        if path.startswith("s3://"):
            return "s3://" + normalize(path.removeprefix("s3://"))
        return normalize(path)

    tensorstore_utils._normalize_path = normalize_keeping_s3
    tensorstore_utils._use_gcs_driver = lambda d: d.startswith("s3://") or use_remote(d)
    gcs_utils.get_kvstore_for_gcs = lambda p: (
        _s3_kvstore(p) if p.startswith("s3://") else gcs_kvstore(p)
    )
