"""The request path of devcluster's API server, one module per stage of kube-apiserver's chain."""
