"""The request filters that run before a request reaches its handler, in kube-apiserver's order:
audit, authentication, impersonation, authorization."""
