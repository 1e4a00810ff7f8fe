"""Admission: the stage of the write path that runs the mutating and validating plugins (webhooks
and ValidatingAdmissionPolicies) in kube-apiserver's order."""
