"""The name formats of Kubernetes' ``apimachinery/pkg/util/validation``, each stated once: a
DNS-1123 subdomain (most object names, label-key prefixes), a DNS-1123 label (namespaces) and a
DNS-1035 label (services), with their length limits and the messages their errors carry."""
from __future__ import annotations

import re

DNS1123_LABEL_FORMAT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_SUBDOMAIN_FORMAT = DNS1123_LABEL_FORMAT + "(\\." + DNS1123_LABEL_FORMAT + ")*"
DNS1035_LABEL_FORMAT = "[a-z]([-a-z0-9]*[a-z0-9])?"

DNS1123_SUBDOMAIN = re.compile(f"^{DNS1123_SUBDOMAIN_FORMAT}$")
DNS1123_LABEL = re.compile(f"^{DNS1123_LABEL_FORMAT}$")
DNS1035_LABEL = re.compile(f"^{DNS1035_LABEL_FORMAT}$")

DNS1123_SUBDOMAIN_MAX_LENGTH = 253
DNS1123_LABEL_MAX_LENGTH = 63
DNS1035_LABEL_MAX_LENGTH = 63

DNS1123_SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    f"start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    f"'{DNS1123_SUBDOMAIN_FORMAT}')")
DNS1123_LABEL_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and "
    f"end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    f"'{DNS1123_LABEL_FORMAT}')")
DNS1035_LABEL_MESSAGE = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic "
    f"character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for "
    f"validation is '{DNS1035_LABEL_FORMAT}')")


def is_dns1123_subdomain(value: str) -> bool:
    return len(value) <= DNS1123_SUBDOMAIN_MAX_LENGTH and DNS1123_SUBDOMAIN.match(value) is not None
