"""Multi-cluster delegation: worker registry, placement and the copy/mirror rules."""
