"""What the Kubernetes API server accepts as a name, a label, a quantity or an extended resource.

Its OpenAPI schema types these fields as plain strings; the server's own validation refuses the
rest. trackway checks them before anything is sent: in trackway.toml (settings/model.py) and in
each Job it renders (executors/kube_manifest.py).
"""

from __future__ import annotations

import re

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # and at most 63 characters
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")  # at most 253
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")  # at most 63
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")  # at most 63
# An extended resource a device plugin advertises: a domain and a name, as `nvidia.com/gpu`, `amd.com/gpu`.
EXTENDED_RESOURCE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+/"
                               r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
QUANTITY = re.compile(r"^[+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")


def is_dns_label(text: str) -> bool:
    return bool(DNS1123_LABEL.match(text)) and len(text) <= 63


def is_dns_subdomain(text: str) -> bool:
    return bool(DNS1123_SUBDOMAIN.match(text)) and len(text) <= 253


def is_label_key(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    return (not prefix or is_dns_subdomain(prefix)) and bool(LABEL_NAME.match(name)) and len(name) <= 63


def is_label_value(value: str) -> bool:
    return bool(LABEL_VALUE.match(value)) and len(value) <= 63
