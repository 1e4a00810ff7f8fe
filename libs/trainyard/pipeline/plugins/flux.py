"""Flux Framework (v2.3.0): the trainer runs under a Flux instance that spans the TrainJob's nodes.

What upstream's plugin plans, reproduced (docs/compatibility.md B6):

* EnforceMLPolicy: the trainer command becomes ``/bin/bash /etc/flux-config/entrypoint.sh
  "<original command>"`` (the TrainJob's args left out); the ``node`` pods get a
  ``flux-installer`` init container (the Flux view image), the view/config/shared-memory
  volumes and the CURVE Secret volume, and the ``node`` container their mounts.
* Build: the ``<name>-flux-entrypoint`` ConfigMap (``init.sh`` for the installer,
  ``entrypoint.sh`` for the node container) and the ``<name>-flux-curve`` Secret
  (``curve.cert``). The Secret is made once and kept (never re-planned while it exists), its
  key random and written by the applier, never on the bus (:mod:`..curve_keys`).

The scripts are trainyard's own; they keep the paths, file names, broker configuration and
flux invocations the Flux view images and users rely on.
"""
from __future__ import annotations

import base64
from typing import Any

from trainyard.api import constants as c

from ..curve_keys import curve_certificate
from ..documents import clone, ensure_list, items, mapping
from ..errors import PlanningError, invalid
from ..framework import ChildKind, PlanContext, Plugin, ValidationContext, Verdict
from ..observed import ReadError
from ..resources import gpu_count
from ..upsert import upsert_volume_mount
from .shared import effective_resources_per_node, is_int

FLUX_INSTALLER = c.FLUX_INSTALLER_CONTAINER_NAME
ENTRYPOINT_SCRIPT = f"{c.FLUX_CONFIG_MOUNT_PATH}/entrypoint.sh"
INIT_SCRIPT = f"{c.FLUX_CONFIG_MOUNT_PATH}/init.sh"
# Broker settings a trainer env variable of the same name changes (the TrainJob's last).
BROKER_DEFAULTS = {
    "FLUX_VIEW_IMAGE": c.FLUX_INSTALLER_IMAGE,
    "FLUX_NETWORK_DEVICE": c.FLUX_NETWORK_DEVICE,
    "FLUX_QUEUE_POLICY": c.FLUX_QUEUE_POLICY,
}
BROKER_PORT = 8050
FLUX_SHARE = c.FLUX_VOLUME_PATH  # /mnt/flux: the view and the configuration, shared by init and node


def _flux_policy(info) -> dict | None:
    flux = mapping(info.ml_policy).get("flux") if info is not None else None
    return flux if isinstance(flux, dict) else None


def config_map_name(trainjob_name: str) -> str:
    return f"{trainjob_name}{c.FLUX_ENTRYPOINT_CONFIGMAP_SUFFIX}"


def curve_secret_name(trainjob_name: str) -> str:
    return f"{trainjob_name}{c.FLUX_CURVE_SECRET_SUFFIX}"


# --- what the pods get ----------------------------------------------------------------------

def broker_settings(ctx: PlanContext) -> dict[str, str]:
    settings = dict(BROKER_DEFAULTS)
    container = ctx.info.trainer_container()
    for entry in items((container or {}).get("env")):
        if isinstance(entry, dict) and entry.get("name") in settings and isinstance(entry.get("value"), str):
            settings[entry["name"]] = entry["value"]
    for entry in items((ctx.trainer or {}).get("env")):
        if isinstance(entry, dict) and entry.get("name") in settings:
            value = entry.get("value")
            settings[entry["name"]] = value if isinstance(value, str) else ""
    return settings


def original_command(ctx: PlanContext) -> str:
    """The trainer's command line as one string: the TrainJob's command (else the runtime
    trainer container's) followed by the TrainJob's args, joined by spaces, trimmed."""
    command = [str(x) for x in items((ctx.info.trainer_container() or {}).get("command"))]
    args: list[str] = []
    trainer = ctx.trainer or {}
    if trainer.get("command") is not None:
        command = [str(x) for x in items(trainer["command"])]
    if trainer.get("args") is not None:
        args = [str(x) for x in items(trainer["args"])]
    return " ".join(command + args).strip()


def _view_volumes(cm_name: str) -> list[dict[str, Any]]:
    return [
        {"name": c.FLUX_SPACK_VIEW_VOLUME_NAME, "emptyDir": {}},
        {"name": c.FLUX_INSTALL_VOLUME_NAME, "emptyDir": {}},
        {"name": cm_name, "configMap": {"name": cm_name, "defaultMode": c.FLUX_CONFIGMAP_DEFAULT_MODE}},
        {"name": c.FLUX_MEMORY_VOLUME_NAME, "emptyDir": {"medium": "Memory"}},
    ]


def enforce_ml_policy(ctx: PlanContext) -> None:
    if _flux_policy(ctx.info) is None:
        return
    settings = broker_settings(ctx)
    cm_name = config_map_name(ctx.name)
    command = ["/bin/bash", ENTRYPOINT_SCRIPT, original_command(ctx)]
    ctx.info.flux_command = command
    installer = {
        "name": FLUX_INSTALLER,
        "image": settings["FLUX_VIEW_IMAGE"],
        "command": ["/bin/bash", INIT_SCRIPT],
        "volumeMounts": [
            {"name": c.FLUX_INSTALL_VOLUME_NAME, "mountPath": c.FLUX_VOLUME_PATH},
            {"name": cm_name, "mountPath": c.FLUX_CONFIG_MOUNT_PATH, "readOnly": True},
        ],
    }
    curve_volume = {"name": c.FLUX_CURVE_VOLUME_NAME,
                    "secret": {"secretName": curve_secret_name(ctx.name),
                               "defaultMode": c.FLUX_CURVE_DEFAULT_MODE}}
    for pod_set in ctx.info.pod_sets:
        if pod_set.name != c.NODE:
            continue
        for volume in _view_volumes(cm_name):
            pod_set.upsert_volume(volume)
        pod_set.upsert_volume(curve_volume)
        ensure_list(pod_set.pod_spec, "initContainers").append(clone(installer))
        container = pod_set.container(c.NODE)
        if container is None:
            continue
        if pod_set.ancestor == c.ANCESTOR_TRAINER:
            container["command"] = list(command)  # also without spec.trainer (the builder skips it)
        mounts = ensure_list(container, "volumeMounts")
        for mount in (
            {"name": c.FLUX_INSTALL_VOLUME_NAME, "mountPath": c.FLUX_VOLUME_PATH},
            {"name": c.FLUX_SPACK_VIEW_VOLUME_NAME, "mountPath": c.FLUX_SPACK_VIEW_VOLUME_PATH},
            {"name": cm_name, "mountPath": c.FLUX_CONFIG_MOUNT_PATH, "readOnly": True},
            {"name": c.FLUX_CURVE_VOLUME_NAME, "mountPath": c.FLUX_CURVE_VOLUME_PATH, "readOnly": True},
            {"name": c.FLUX_MEMORY_VOLUME_NAME, "mountPath": c.FLUX_MEMORY_VOLUME_PATH, "readOnly": True},
        ):
            upsert_volume_mount(mounts, mount)


# --- the ConfigMap and the Secret -----------------------------------------------------------

def number_range(size: int, start: int = 0) -> str:
    """Flux idset text: ``start`` alone for one, else ``start-end``."""
    return str(start) if size == 1 else f"{start}-{start + size - 1}"


def hostlist(prefix: str, size: int) -> str:
    """The node pods' host names as a Flux hostlist (replicated job ``node``, replica 0)."""
    return f"{prefix}-{c.NODE}-0-[{number_range(size)}]"


def _toml_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def broker_config(name: str, namespace: str, hosts: str, settings: dict[str, str]) -> str:
    """broker.toml: access, R file, CURVE bootstrap over the JobSet's headless Service, job
    archive and the fluxion queue policy (values as upstream's)."""
    bind = f"tcp://{settings['FLUX_NETWORK_DEVICE']}:%p"
    connect = f"tcp://%h.{name}.{namespace}.svc.cluster.local:%p"
    config = FLUX_SHARE + "/config"
    return "\n".join([
        f"# Flux broker configuration for TrainJob {namespace}/{name} (written by trainyard)",
        "[access]",
        "allow-guest-user = true",
        "allow-root-owner = true",
        "",
        "[resource]",
        f"path = {_toml_string(config + '/etc/flux/system/R')}",
        "",
        "[bootstrap]",
        f"curve_cert = {_toml_string(config + '/etc/curve/curve.cert')}",
        f"default_port = {BROKER_PORT}",
        f"default_bind = {_toml_string(bind)}",
        f"default_connect = {_toml_string(connect)}",
        f"hosts = [{{ host = {_toml_string(hosts)} }}]",
        "",
        "[archive]",
        f"dbpath = {_toml_string(config + '/var/lib/flux/job-archive.sqlite')}",
        'period = "1m"',
        'busytimeout = "50s"',
        "",
        "[sched-fluxion-qmanager]",
        f"queue-policy = {_toml_string(settings['FLUX_QUEUE_POLICY'])}",
    ])


INIT_SH = """#!/bin/bash
# trainyard: Flux installer for TrainJob {namespace}/{name} (init container "flux-installer").
# Copies the Flux view of this image into the shared volume {share} and writes the broker
# configuration and host list that every node's broker reads.
share={share}
config=${{share}}/config
echo "Preparing Flux on $(hostname)"
export PATH=/opt/view/bin:$PATH
mkdir -p /opt/view/bin
mkdir -p ${{config}}/etc/flux/system/cron.d ${{config}}/var/lib/flux ${{config}}/etc/flux/config \\
  ${{config}}/run/flux ${{config}}/etc/curve ${{share}}/view

echo "{hosts}" > ${{config}}/etc/flux/system/hostlist
cat > ${{config}}/etc/flux/config/broker.toml <<'TRAINYARD_BROKER_TOML'
{broker}
TRAINYARD_BROKER_TOML
echo "Flux broker configuration:"
cat ${{config}}/etc/flux/config/broker.toml

# The view is /opt/views/._view/<id> (/opt/view links to it); its spack links point into
# /opt/software, which the node container restores from the copy made here.
view=/opt/views/._view/$(ls /opt/views/._view/)
echo "Copying ${{view}} and /opt/software into ${{share}}"
cp -R ${{view}}/* ${{share}}/view
cp -R /opt/software ${{share}}/
touch ${{share}}/flux-operator-done.txt
echo "Flux view ready."
"""

ENTRYPOINT_SH = """#!/bin/bash
# trainyard: Flux entrypoint for TrainJob {namespace}/{name} (the node container).
# Its arguments are the trainer's command; pod {lead} starts Flux and runs the command with
# "flux run", the other nodes' brokers join it. Without a command the lead broker waits for
# interactive use.
share={share}
view=${{share}}/view
config=${{share}}/config
flux_uid=$(id -u $(whoami))

# Flux after the image's own tools (so the image's Python stays first).
export PATH=$PATH:${{view}}/bin
cp -R ${{share}}/software/* /opt/software/

# Flux's Python modules come with the view.
python_lib=$(find ${{view}} -maxdepth 2 -type d -path "${{view}}/lib/python3*" 2>/dev/null)
python_bin=${{view}}/bin/$(basename "${{python_lib}}")
echo "Flux Python: ${{python_bin}} (${{python_lib}})"
if [[ -f "${{python_bin}}" ]]; then
  rm -rf ${{view}}/bin/python3 ${{view}}/bin/python
  ln -s ${{python_bin}} ${{view}}/lib/python || true
  ln -s ${{python_bin}} ${{view}}/lib/python3 || true
fi
export PYTHONPATH=${{PYTHONPATH:-""}}:${{python_lib}}/site-packages
export FLUX_RC_EXTRA=${{view}}/etc/flux/rc1.d

# Helpers for users of the instance: switch to the fluxion scheduler, load the environment.
cat > ${{share}}/load-fluxion.sh <<'TRAINYARD_EOF'
flux module remove sched-simple
flux module load sched-fluxion-resource
flux module load sched-fluxion-qmanager
TRAINYARD_EOF
cat > ${{share}}/flux-view.sh <<TRAINYARD_EOF
#!/bin/bash
export PATH=${{PATH}}
export PYTHONPATH=${{PYTHONPATH}}
export LD_LIBRARY_PATH=${{LD_LIBRARY_PATH:-""}}:${{view}}/lib
export fluxsocket=local://${{config}}/run/flux/local
TRAINYARD_EOF

# The CURVE certificate, readable by its owner only.
curve=${{config}}/etc/curve/curve.cert
cp {curve_dir}/curve.cert ${{curve}}
chmod go-r ${{curve}}
chown -R ${{flux_uid}} ${{curve}}

# This node's resources for Flux (R).
flux R encode --hosts=$(cat ${{config}}/etc/flux/system/hostlist) {rspec} > /tmp/R
mv /tmp/R ${{config}}/etc/flux/system/R

export STATE_DIR=${{config}}/var/lib/flux
export FLUX_OUTPUT_DIR=/tmp/fluxout
mkdir -p ${{STATE_DIR}} ${{FLUX_OUTPUT_DIR}} ${{config}}/etc/flux/system/cron.d
broker_config=${{config}}/etc/flux/config
broker_options="-Scron.directory=${{config}}/etc/flux/system/cron.d -Stbon.fanout=256 \\
 -Srundir=${{config}}/run/flux -Sstatedir=${{STATE_DIR}} -Slocal-uri=local://${{config}}/run/flux/local \\
 -Slog-stderr-level=0 -Slog-stderr-mode=local"
command="$@"

if [ "$(hostname)" = "{lead}" ]; then
  if [ -z "${{command}}" ]; then
    echo "No command given: flux broker --config-path ${{broker_config}} ${{broker_options}}"
    flux broker --config-path ${{broker_config}} ${{broker_options}}
  else
    echo "Running: flux run {flags} ${{command}}"
    flux start -o --config ${{broker_config}} ${{broker_options}} flux run {flags} ${{command}}
  fi
else
  # A follower joins the lead broker; until that succeeds, it tries again every 15 seconds.
  until flux start -o --config ${{broker_config}} ${{broker_options}}; do
    echo "Flux follower broker exited with $?; trying again in 15s"
    sleep 15
  done
  echo "Flux follower broker finished."
fi

touch ${{share}}/flux-operator-complete.txt
"""


def _num_nodes(ctx: PlanContext) -> int:
    trainer = ctx.trainer or {}
    if is_int(trainer.get("numNodes")):
        return int(trainer["numNodes"])
    # Upstream dereferences spec.trainer.numNodes (a TrainJob without it crashes its
    # reconciler); trainyard uses the node count the runtime gives (docs/compatibility.md B6).
    trainer_set = ctx.info.pod_set_by_ancestor(c.ANCESTOR_TRAINER)
    return trainer_set.count if trainer_set is not None else c.DEFAULT_NUM_NODES


def _num_proc_per_node(ctx: PlanContext) -> int:
    trainer = ctx.trainer or {}
    if is_int(trainer.get("numProcPerNode")):
        return int(trainer["numProcPerNode"])
    value = (_flux_policy(ctx.info) or {}).get("numProcPerNode")
    return int(value) if is_int(value) else 1  # the CRD's default


def entrypoint_script(ctx: PlanContext) -> str:
    nodes = _num_nodes(ctx)
    tasks = _num_proc_per_node(ctx)
    flags = f"-N {nodes} -n {tasks * nodes}"
    rspec = f"--cores={number_range(tasks)}"
    gpus = gpu_count(effective_resources_per_node(ctx.trainjob, ctx.info))
    if gpus > 0:
        flags += f" -g {gpus}"  # GPUs per task
        rspec += f" --gpu={number_range(gpus)}"
    return ENTRYPOINT_SH.format(namespace=ctx.namespace, name=ctx.name, share=FLUX_SHARE,
                                lead=f"{ctx.name}-{c.NODE}-0-0", rspec=rspec, flags=flags,
                                curve_dir=c.FLUX_CURVE_VOLUME_PATH)


def init_script(ctx: PlanContext, settings: dict[str, str]) -> str:
    hosts = hostlist(ctx.name, _num_nodes(ctx))
    return INIT_SH.format(namespace=ctx.namespace, name=ctx.name, share=FLUX_SHARE, hosts=hosts,
                          broker=broker_config(ctx.name, ctx.namespace, hosts, settings))


def build(ctx: PlanContext) -> list[dict[str, Any]]:
    if _flux_policy(ctx.info) is None:
        return []
    settings = broker_settings(ctx)
    objects: list[dict[str, Any]] = [{
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": config_map_name(ctx.name), "namespace": ctx.namespace,
                     "ownerReferences": [ctx.owner_reference()]},
        "data": {"entrypoint.sh": entrypoint_script(ctx), "init.sh": init_script(ctx, settings)},
    }]
    secret_name = curve_secret_name(ctx.name)
    try:
        existing = ctx.observed.get("v1", "Secret", ctx.namespace, secret_name)
    except ReadError as err:
        raise PlanningError(str(err)) from None
    if existing is None:  # made once and kept: the brokers of running pods hold its key
        try:
            secret, public = ctx.new_curve_key()
        except Exception as err:  # key generation failure (cryptography backend)
            raise PlanningError(f"failed to create curve private key: {err}") from None
        cert = curve_certificate(ctx.name, secret, public) if secret else ""
        objects.append({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": secret_name, "namespace": ctx.namespace,
                         "ownerReferences": [ctx.owner_reference()]},
            "data": {c.FLUX_CURVE_CERT_KEY: base64.b64encode(cert.encode()).decode("ascii")},
        })
    return objects


def validate(ctx: ValidationContext) -> Verdict:
    verdict = Verdict()
    policy = _flux_policy(ctx.info)
    if policy is None:
        return verdict
    nproc = mapping(ctx.trainer).get("numProcPerNode", policy.get("numProcPerNode"))
    if is_int(nproc) and nproc < 1:
        verdict.errors.append(invalid("spec.trainer.numProcPerNode", nproc,
                                      "must be greater than or equal to 1 for Flux TrainJob"))
    node = ctx.info.pod_set_by_name(c.NODE)
    if node is not None:
        for init in items(node.pod_spec.get("initContainers")):
            if mapping(init).get("name") == FLUX_INSTALLER:
                verdict.errors.append(invalid("spec.trainer.initContainers", FLUX_INSTALLER,
                                              "InitContainer 'flux-installer' is reserved"))
    return verdict


PLUGIN = Plugin(name="Flux", enforce_ml_policy=enforce_ml_policy, build=build, validate=validate,
                children=(ChildKind("v1", "ConfigMap", c.FLUX_ENTRYPOINT_CONFIGMAP_SUFFIX),
                          ChildKind("v1", "Secret", c.FLUX_CURVE_SECRET_SUFFIX)))
