"""`trainyard plan`: the objects the controller would apply for TrainJobs, offline.

Reads multi-document YAML (TrainJobs, runtimes, and optionally observed cluster objects such
as an existing JobSet or MPI Secret), validates each TrainJob like the admission webhook, and
prints the desired objects of every accepted TrainJob as multi-document YAML (or a JSON List)
in a stable order. Rejected TrainJobs: errors on stderr (as kubectl shows them), exit 1.
Unreadable YAML: file, line and column on stderr, exit 2.

This module also holds the input handling that `trainyard validate` shares.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainyard.errors import UserError
from trainyard.compat import add_compat_argument, compat_from_args

HELP = "Print the objects (JobSet, PodGroup, Secret, ConfigMap) planned for TrainJobs in YAML files."

TRAINER_API_VERSION = "trainer.kubeflow.org/v1alpha1"
RUNTIME_KINDS = ("TrainingRuntime", "ClusterTrainingRuntime")
CLUSTER_SCOPED_KINDS = {"ClusterTrainingRuntime", "PriorityClass", "Namespace", "Node", "RuntimeClass",
                        "CustomResourceDefinition"}


@dataclass
class Document:
    """One YAML document, where it came from, and its (namespace-defaulted) content."""

    body: dict[str, Any]
    source: str  # "file.yaml" or "file.yaml (document 2)"

    @property
    def kind(self) -> str:
        return str(self.body.get("kind") or "")

    @property
    def name(self) -> str:
        return str((self.body.get("metadata") or {}).get("name") or "")

    @property
    def namespace(self) -> str:
        return str((self.body.get("metadata") or {}).get("namespace") or "")

    @property
    def is_trainer_kind(self) -> bool:
        return self.body.get("apiVersion") == TRAINER_API_VERSION


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--filename", dest="files", action="append", required=True, metavar="FILE",
                        help="YAML file with TrainJobs, runtimes and observed objects ('-' for stdin); repeatable")
    parser.add_argument("--runtimes", metavar="DIR", action="append", default=[],
                        help="directory of runtime YAML files (*.yaml, *.yml) to resolve runtimeRefs against")
    parser.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml", help="output format")
    parser.add_argument("-n", "--namespace", default="default",
                        help="namespace for namespaced objects that name none (default: default)")
    add_compat_argument(parser)


def _read_text(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: cannot read: {err}") from None


def parse_documents(text: str, filename: str, namespace: str) -> list[Document]:
    """The non-empty mapping documents of a YAML stream; errors name file, line and column."""
    import yaml

    from trainyard.apimachinery import yaml_json

    try:
        raw = list(yaml_json.load_all(text))
    except yaml_json.YamlJsonError as exc:  # an alias bomb, a document that contains itself
        raise UserError(f"{filename}: invalid YAML: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        where = f"{filename}:{mark.line + 1}:{mark.column + 1}" if mark is not None else filename
        raise UserError(f"{where}: invalid YAML: {problem}") from None
    documents: list[Document] = []
    count = 0
    for body in _flatten_lists(raw):
        if body is None:
            continue
        count += 1
        source = filename if count == 1 else f"{filename} (document {count})"
        if not isinstance(body, dict):
            raise UserError(f"{source}: expected a Kubernetes object (a mapping), got {type(body).__name__}")
        for key in ("apiVersion", "kind"):
            if not isinstance(body.get(key), str) or not body[key]:
                raise UserError(f"{source}: {key}: Required value")
        metadata = body.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise UserError(f"{source}: metadata: must be a mapping")
        if body["kind"] in CLUSTER_SCOPED_KINDS:
            if (metadata or {}).get("namespace"):  # kubectl ignores it for cluster-scoped objects
                body = {**body, "metadata": {k: v for k, v in metadata.items() if k != "namespace"}}
        elif not (metadata or {}).get("namespace"):
            body = {**body, "metadata": {**(metadata or {}), "namespace": namespace}}
        documents.append(Document(body, source))
    return documents


def _flatten_lists(raw: list[Any]) -> list[Any]:
    """Expand ``kind: List`` documents (what ``kubectl get -o yaml`` prints) into their items."""
    flat: list[Any] = []
    for body in raw:
        if isinstance(body, dict) and body.get("kind") == "List" and isinstance(body.get("items"), list):
            flat.extend(body["items"])
        else:
            flat.append(body)
    return flat


def _yaml_files(directory: Path) -> list[Path]:
    return sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")])


def load_inputs(files: list[str], runtime_dirs: list[str], namespace: str) -> list[Document]:
    """Documents of the ``--runtimes`` directories, then of the ``-f`` files (a directory
    stands for its ``*.yaml``/``*.yml`` files, as with kubectl)."""
    documents: list[Document] = []
    for directory in runtime_dirs:
        if not Path(directory).is_dir():
            raise UserError(f"--runtimes {directory}: not a directory")
        for file in _yaml_files(Path(directory)):
            documents.extend(parse_documents(_read_text(str(file)), str(file), namespace))
    for file in files:
        paths = _yaml_files(Path(file)) if file != "-" and Path(file).is_dir() else [file]
        for path in map(str, paths):
            documents.extend(parse_documents(_read_text(path), "<stdin>" if path == "-" else path, namespace))
    return documents


def render_rejection(result: Any, doc: Document, operation: str) -> list[str]:
    """What kubectl prints for a request the API server or the webhook refuses."""
    reason = "Invalid" if result.code == 422 else "Forbidden"
    message = result.kubectl_message(doc.kind, doc.name)
    return [f'Error from server ({reason}): error when {operation} "{doc.source}": {message}']


def print_warnings(warnings: list[str]) -> None:
    for warning in warnings:
        print(f"Warning: {warning}", file=sys.stderr)


def cluster_state(documents: list[Document]) -> list[dict[str, Any]]:
    return [doc.body for doc in documents if doc.kind != "TrainJob"]


def run(args: argparse.Namespace) -> int:
    from trainyard.pipeline import ObservedState, PlanningError, plan, validate_trainjob

    compat = compat_from_args(args, UserError)
    documents = load_inputs(args.files, args.runtimes, args.namespace)
    trainjobs = [d for d in documents if d.kind == "TrainJob" and d.is_trainer_kind]
    if not trainjobs:
        raise UserError("no TrainJob found in the input files", exit_code=1)
    state = ObservedState.of(cluster_state(documents))
    rejected = False
    planned: list[dict[str, Any]] = []
    for doc in trainjobs:
        result = validate_trainjob(doc.body, observed=state, compat=compat)
        print_warnings(result.warnings)
        if not result.allowed:
            rejected = True
            for line in render_rejection(result, doc, "creating"):
                print(line, file=sys.stderr)
            continue
        try:
            planned.extend(plan(doc.body, observed=state, compat=compat).objects)
        except PlanningError as err:
            rejected = True
            print(f'error: TrainJob "{doc.name}" ({doc.source}): TrainJob resources reconciliation failed: '
                  f"{err.message}", file=sys.stderr)
    _write(planned, args.output)
    return 1 if rejected else 0


def _write(objects: list[dict[str, Any]], output: str) -> None:
    if not objects:
        return
    if output == "json":
        import json

        sys.stdout.write(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2) + "\n")
        return
    from trainyard.pipeline import render_yaml

    sys.stdout.write(render_yaml(objects))
