"""The registry: the generic store, its write chain and the per-kind strategies, with the
machinery they share (schemas, names, UIDs, field validation)."""
