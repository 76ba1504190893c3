"""When the API server refuses an object, and whether that may pass.

The same question comes from two places: the operator creating what an experiment needs (its
Service, NetworkPolicy, ServiceAccount, Role, RoleBinding and Job), and the Job controller
creating the trainer pods (its FailedCreate events, rules/startup.py). Either way a
refusal said once is said again on every retry of the same request, unless something else
changes: a quota frees up or is raised, a permission is granted. So:

| the API server's answer | verdict |
|---|---|
| 400 Bad Request, 413 too large, 422 Invalid: the object itself | refused for good |
| 403: a ResourceQuota, a webhook that does not answer, a permission missing | may pass |
| 403: PodSecurity, no such PriorityClass, a policy or webhook `denied` it | refused for good |
| anything else (409 a race, 404, 429, 5xx, no answer) | not a refusal: an error, retried |

For the operator's own objects, refused for good fails the experiment (reason
CreationRefused); may pass keeps it Blocked (CreationFailing) and tries again after as long
as it has been Blocked (RETRY_MIN_SECONDS to RETRY_MAX_SECONDS): quick while a quota is
being fixed, and a handful of requests an hour when nobody does.
"""

from __future__ import annotations

from datetime import datetime

from evokube_operator import api
from evokube_operator.util import clip

# HTTP codes by which the API server refuses a request as it is.
REFUSAL_CODES = frozenset({400, 403, 413, 422})
# Of these, the codes that refuse the object itself, whatever the message says.
INVALID_CODES = frozenset({400, 413, 422})
# The first pattern found in a refusal's message decides (case-sensitive, as the API server
# writes them); True: refused for good. No pattern: may pass.
REFUSALS: tuple[tuple[str, bool], ...] = (
    ("quota", False),  # exceeded (other objects may go), or a new quota not counted yet
    ("error looking up service account", False),  # a pod's, created a moment after the Job
    ("failed calling webhook", False),  # a webhook that does not answer (yet)
    ("cannot create resource", False),  # RBAC: the operator's own permissions, an admin's fix
    ("cannot patch resource", False),
    ("attempting to grant RBAC permissions not currently held", False),
    ("violates PodSecurity", True),
    ("no PriorityClass with name", True),
    ("denied", True),  # an admission webhook or a ValidatingAdmissionPolicy said no
    ("is invalid", True),
    ("is forbidden", True),
)
RETRY_MIN_SECONDS = 5.0
RETRY_MAX_SECONDS = 300.0


def final(message: str) -> bool:
    """Whether a refusal with this message is refused again whatever else changes."""
    return next((final for text, final in REFUSALS if text in message), False)


class Refusal(Exception):
    """The API server refused to create (or update) an object an experiment needs."""

    def __init__(self, kind: str, name: str, code: int, message: str):
        super().__init__(f"{kind} {name}: {code} {message}")
        self.kind = kind
        self.name = name
        self.code = code
        self.api_message = message

    @property
    def final(self) -> bool:
        return self.code in INVALID_CODES or final(self.api_message)

    @property
    def reason(self) -> str:
        return api.REASON_CREATION_REFUSED if self.final else api.REASON_CREATION_FAILING

    @property
    def message(self) -> str:
        """For the condition and the Event: the object and the API server's own words."""
        return clip(f"the API server refused {self.kind} {self.name}: {self.api_message}")


def retry_after(blocked_since: datetime | None, now: datetime) -> float:
    """Seconds until a refusal that may pass is tried again: as long as the experiment has been
    Blocked, within RETRY_MIN_SECONDS and RETRY_MAX_SECONDS (so the delays double)."""
    blocked_for = 0.0 if blocked_since is None else (now - blocked_since).total_seconds()
    return min(RETRY_MAX_SECONDS, max(RETRY_MIN_SECONDS, blocked_for))
