"""API models for every object trainyard reads or writes (pydantic v2).

Modules: ``meta`` (base model, ObjectMeta, Condition), ``core`` and ``batch`` (built-in
Kubernetes types, to the depth trainyard uses), ``trainer`` (TrainJob and runtimes),
``jobset``, ``scheduling`` (PodGroups), ``constants``, ``objects`` (parse/dump/errors),
``defaults`` (server-side defaulting) and ``crds`` (CRD generation).
"""
