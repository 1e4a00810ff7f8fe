"""``trainyard crds``: write the CRDs generated from the API models."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainyard.errors import UserError

HELP = (
    "Generate the CustomResourceDefinitions (TrainJob, TrainingRuntime, ClusterTrainingRuntime,"
    " JobSet, coscheduling and Volcano PodGroup, Volcano Queue) from the API models."
    " Without --out, prints them to stdout as one multi-document YAML stream."
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out",
        metavar="DIR",
        type=Path,
        help="write one file per CRD (<group>_<plural>.yaml) into DIR, e.g. deploy/crds;"
        " other files in DIR are left alone",
    )
    parser.add_argument(
        "--multicluster",
        action="store_true",
        help="generate the manager cluster's MultiKueueCluster CRD instead (for clusters without"
        " Kueue), e.g. into deploy/multicluster/crds",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="with --out: write nothing, exit 1 and name the files that differ from a fresh"
        " generation (for CI)",
    )


def render(crd: dict) -> str:
    """The YAML text of one CRD, as committed in deploy/crds (sorted keys, stable)."""
    import yaml

    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(crd, Dumper=dumper, sort_keys=True, width=100, allow_unicode=True)


def run(args: argparse.Namespace) -> int:
    from trainyard.api.crds import CRDS, MULTICLUSTER_CRDS, crd_file_names, generate_crd

    infos = MULTICLUSTER_CRDS if args.multicluster else CRDS

    if args.out is None:
        if args.check:
            raise UserError("--check needs --out DIR (the directory to compare with)")
        sys.stdout.write("---\n".join(render(generate_crd(info)) for info in infos))
        return 0
    if args.out.exists() and not args.out.is_dir():
        raise UserError(f"--out: {args.out} is not a directory")
    files = {name: render(crd) for name, crd in crd_file_names(infos).items()}
    if args.check:
        stale = [name for name, text in files.items() if _read(args.out / name) != text]
        for name in stale:
            print(f"{args.out / name}: differs from a fresh generation (run: trainyard crds --out {args.out})", file=sys.stderr)
        return 1 if stale else 0
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (args.out / name).write_text(text, encoding="utf-8")
    except OSError as err:
        raise UserError(f"--out: cannot write to {args.out}: {err.strerror}") from None
    print(f"wrote {len(files)} CRDs to {args.out}", file=sys.stderr)
    return 0


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):  # missing, unreadable or not text: it differs
        return None
