"""A discovered target's name: a template over its labels (`{namespace}.{pod}`), and whether
a name can be used. Shared by discovery through Prometheus (collectors/discovery.py) and
through the Kubernetes API (collectors/kubernetes.py), so both name targets alike."""

from __future__ import annotations

import re
import string

_VALID_NAME = re.compile(r"^[A-Za-z0-9_.:-]+$")


class MissingLabel(KeyError):
    """A template names a label the target does not have."""


def render(template: str, labels: dict[str, str]) -> str:
    """The template with each `{label}` replaced by the label's value."""
    out = []
    for text, field, _, _ in string.Formatter().parse(template):
        out.append(text)
        if field is not None:
            if field not in labels:
                raise MissingLabel(field)
            out.append(labels[field])
    return "".join(out)


def usable_name(name: str) -> bool:
    """Can a target be named this (letters, digits and `_ . : -`, at most 200)?"""
    return bool(_VALID_NAME.match(name)) and len(name) <= 200
