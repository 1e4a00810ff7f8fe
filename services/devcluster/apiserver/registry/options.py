"""What every stage of a write knows about the request besides the object: ``WriteOptions``."""
from __future__ import annotations

from dataclasses import dataclass, field

from trainyard.apimachinery.rbac import UserInfo

# The request key under which a request's WriteOptions.audit_annotations are kept for its audit
# event (filters/audit.py writes the event at the request's end).
AUDIT_ANNOTATIONS = "devcluster.audit_annotations"


@dataclass
class WriteOptions:
    manager: str = ""
    manager_given: bool = True  # False when the manager was derived from the User-Agent
    field_validation: str = "Strict"
    dry_run: bool = False
    force: bool = False
    subresource: str | None = None
    warnings: list[str] = field(default_factory=list)
    # the requesting (or impersonated) user: request.userInfo of policies and webhooks; None for
    # the server's own writes, which admission sees as the administrator
    user: UserInfo | None = None
    # annotations admission adds to the request's audit event (ValidatingAdmissionPolicy
    # auditAnnotations, validation failures of bindings with the Audit action); the first value
    # written for a key stays, as kube-apiserver's admission.Attributes.AddAnnotation
    audit_annotations: dict[str, str] = field(default_factory=dict)
