"""`trainyard validate`: offline admission of TrainJobs and runtimes, for CI and GitOps repos.

Each TrainJob and runtime in the files is checked as a create, or as an update of the object
with the same kind, namespace and name in the ``--old`` files: the CRD schema and CEL rules,
then the validating webhook (runtime resolution, plugin rules, immutability and suspend
rules). Other documents are the cluster state the rules read (an existing JobSet,
PriorityClasses). ValidatingAdmissionPolicies and their bindings among the documents are
enforced first, as kube-apiserver does, with the Namespaces and parameter objects of the files
(``--as``/``--as-group`` name the requesting user, as with kubectl). Warnings print as
``Warning: <text>``; rejections print what kubectl shows. Exit 1 when anything is rejected, 0
when all is accepted, 2 for unreadable input.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

from trainyard.errors import UserError
from trainyard.compat import add_compat_argument, compat_from_args

HELP = "Validate TrainJobs and runtimes in YAML files like the admission webhooks do (create or --old update)."


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--filename", dest="files", action="append", required=True, metavar="FILE",
                        help="YAML file with TrainJobs, runtimes and cluster objects ('-' for stdin); repeatable")
    parser.add_argument("--old", dest="old_files", action="append", default=[], metavar="FILE",
                        help="YAML file with the current versions: matching objects are validated as updates")
    parser.add_argument("--runtimes", metavar="DIR", action="append", default=[],
                        help="directory of runtime YAML files the TrainJobs may reference")
    parser.add_argument("-n", "--namespace", default="default",
                        help="namespace for namespaced objects that name none (default: default)")
    parser.add_argument("--as", dest="as_user", default="trainyard-validate", metavar="USER",
                        help="user the ValidatingAdmissionPolicies see (request.userInfo.username)")
    parser.add_argument("--as-group", dest="as_groups", action="append", default=[], metavar="GROUP",
                        help="group of that user (repeatable; system:authenticated is always one)")
    add_compat_argument(parser)


_RESOURCES = {"TrainJob": "trainjobs", "TrainingRuntime": "trainingruntimes",
              "ClusterTrainingRuntime": "clustertrainingruntimes"}
_REASONS = {401: "Unauthorized", 403: "Forbidden", 413: "RequestEntityTooLarge"}


def _policy_rejection(denial: Any, doc: Any, operation: str) -> str:
    """What kubectl prints for a ValidatingAdmissionPolicy denial."""
    resource = _RESOURCES[doc.kind]
    if denial.code == 422:  # kubectl shows an Invalid status as a field error with no field
        return f'The {resource} "{doc.name}" is invalid: : {denial.message}'
    return (f'Error from server ({_REASONS.get(denial.code, "Forbidden")}): error when {operation} "{doc.source}": '
            f'{resource}.trainer.kubeflow.org "{doc.name}" is forbidden: {denial.message}')


def _key(body: dict[str, Any]) -> tuple[str, str, str]:
    meta = body.get("metadata") or {}
    return str(body.get("kind")), str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _evaluate(evaluate: Any, *args: Any) -> Any:
    try:
        return evaluate(*args)
    except (AttributeError, TypeError, KeyError, ValueError) as err:  # a policy shape kube-apiserver would refuse
        raise UserError(f"a ValidatingAdmissionPolicy or binding in the files is malformed: {type(err).__name__}: "
                        f"{err}", exit_code=1) from None


def run(args: argparse.Namespace) -> int:
    from trainyard.apimachinery.admission_policy import Attributes, DocumentSource, evaluate, policies_among
    from trainyard.cli.plan import (CLUSTER_SCOPED_KINDS, RUNTIME_KINDS, cluster_state, load_inputs, print_warnings,
                                    render_rejection)
    from trainyard.pipeline import ObservedState, validate_runtime, validate_trainjob

    compat = compat_from_args(args, UserError)
    documents = load_inputs(args.files, [], args.namespace)
    # Runtimes from --runtimes directories are cluster state the TrainJobs read, not checked.
    context = load_inputs([], args.runtimes, args.namespace) if args.runtimes else []
    old_documents = load_inputs(args.old_files, [], args.namespace) if args.old_files else []
    old_by_key = {_key(d.body): d.body for d in old_documents}
    checked = [d for d in documents if d.is_trainer_kind and d.kind in ("TrainJob", *RUNTIME_KINDS)]
    if not checked:
        raise UserError("no TrainJob, TrainingRuntime or ClusterTrainingRuntime found in the input files",
                        exit_code=1)
    # Runtimes named only in --old files are cluster state too (an update keeps referencing them).
    state_docs = cluster_state(context + documents)
    new_keys = {_key(body) for body in state_docs}
    state_docs += [d.body for d in old_documents if d.kind in RUNTIME_KINDS and _key(d.body) not in new_keys]
    state = ObservedState.of(state_docs)
    objects = [d.body for d in context + documents]
    try:
        policies, bindings = policies_among(objects)
    except ValueError as err:
        raise UserError(str(err), exit_code=1) from None
    source = DocumentSource(objects, CLUSTER_SCOPED_KINDS)
    user = {"username": args.as_user, "groups": [*args.as_groups, "system:authenticated"]}
    rejected = False
    for doc in checked:
        old = old_by_key.get(_key(doc.body))
        if policies and bindings:
            group, _, version = str(doc.body.get("apiVersion")).partition("/")
            outcome = _evaluate(evaluate, policies, bindings, Attributes(
                operation="UPDATE" if old is not None else "CREATE", group=group, version=version,
                resource=_RESOURCES[doc.kind], kind=doc.kind, namespaced=doc.kind != "ClusterTrainingRuntime",
                name=doc.name, namespace=doc.namespace, object=doc.body, old_object=old, user_info=user), source)
            print_warnings(outcome.warnings)
            if outcome.denial is not None:
                rejected = True
                print(_policy_rejection(outcome.denial, doc, "updating" if old is not None else "creating"),
                      file=sys.stderr)
                continue
        if doc.kind == "TrainJob":
            result = validate_trainjob(doc.body, old, observed=state, compat=compat)
        else:
            result = validate_runtime(doc.body, old)
        print_warnings(result.warnings)
        if result.allowed:
            action = "update" if old is not None else "create"
            print(f"{doc.kind.lower()}.trainer.kubeflow.org/{doc.name} accepted ({action})")
        else:
            rejected = True
            for line in render_rejection(result, doc, "updating" if old is not None else "creating"):
                print(line, file=sys.stderr)
    return 1 if rejected else 0
