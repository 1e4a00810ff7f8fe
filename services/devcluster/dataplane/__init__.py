"""The devcluster data plane: a JobSet controller, a Job controller, a gang-aware scheduler
and a pod runner ("kubelet") that starts each pod's containers as local processes.

Controllers talk to the devcluster API server like any client (trainyard.kube.client with a
kubeconfig). Pure decision logic lives in small modules (``envexpand``, ``podenv``,
``podstatus``, ``scheduling``, ``jobs``, ``jobsets``); I/O lives at the edges
(``network``, ``runner``, ``controllers``).
"""
