"""Security helpers shared by every component: the certificate authority (:mod:`.pki`)."""
