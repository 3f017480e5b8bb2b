"""Which versions of a model to serve (the version policy), and what a version number is.

The version policy (Triton's): `latest:N` (the N highest complete versions), `all`, or
`specific:1,3`; server-wide from `GMLP_VERSION_POLICY`, per model from `NAME/policy.json`
(`{"version_policy": "latest:2"}`, or Triton's `{"latest": {"num_versions": 2}}` form), or from
the `config` parameter of a repository load call.

A version number has one spelling wherever it enters (a REST path, a gRPC request, a version
directory's name, a policy string or file): `parse_version`, 1 to `MAX_VERSION_DIGITS` ASCII
digits without a sign, whitespace or leading zero. `str.isdigit` and `int` are both looser (`int`
takes "+1", " 1", "1_0" and Arabic-Indic digits; `isdigit` takes superscripts, which `int`
refuses), so neither is used on a version anywhere. What is on disk is read by
`contract.scan`; nothing here loads a model.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from contract import strict_json
from contract.messages import echo

POLICY_FILE = "policy.json"
# int64, as Triton's versions are: 18 digits always fit.
MAX_VERSION_DIGITS = 18
VERSION_FORM = f"1 to {MAX_VERSION_DIGITS} ASCII digits (0-9), no sign, space or leading zero"
_VERSION = re.compile(rf"[1-9][0-9]{{0,{MAX_VERSION_DIGITS - 1}}}")


class VersionError(ValueError):
    """Text that is not a version number; the message says what one is."""


def parse_version(text: object) -> int:
    """The version number `text` spells (see the module docstring); VersionError otherwise.
    A JSON integer (not a bool) in range is taken as well, for Triton's JSON policy forms."""
    if isinstance(text, int) and not isinstance(text, bool) and 0 < text < 10**MAX_VERSION_DIGITS:
        return text
    if isinstance(text, str) and _VERSION.fullmatch(text):
        return int(text)
    raise VersionError(f"a version is {VERSION_FORM}")


class PolicyError(ValueError):
    """A version policy that cannot be read; the message says which forms are accepted."""


POLICY_FORMS = f"latest:N, all, or specific:V[,V...] (N and each V: {VERSION_FORM})"


@dataclass(frozen=True)
class VersionPolicy:
    """Which of a model's complete versions to serve."""

    kind: Literal["latest", "all", "specific"] = "latest"
    count: int = 1
    versions: tuple[int, ...] = ()

    @classmethod
    def parse(cls, value: object) -> VersionPolicy:
        """`latest:N`, `all`, `specific:1,3`, or Triton's JSON form ({"latest": {"num_versions": N}},
        {"all": {}}, {"specific": {"versions": [1, 3]}})."""
        form = value
        try:
            if isinstance(value, str):  # as the JSON form, read below
                kind, _, rest = value.partition(":")
                if kind != "all" or not rest:
                    form = {kind: {"num_versions": rest or 1, "versions": rest.split(",")}}
            if isinstance(form, dict) and len(form) == 1:
                ((kind, body),) = form.items()
                body = body or {}
                if kind == "all":
                    return cls("all")
                if kind == "latest":
                    return cls._checked("latest", parse_version(body.get("num_versions", 1)), ())
                if kind == "specific":
                    return cls._checked("specific", 1, tuple(map(parse_version, body.get("versions", []))))
        except (ValueError, TypeError, AttributeError):
            pass
        raise PolicyError(f"version policy {echo(value, 80)}: expected {POLICY_FORMS}")

    @classmethod
    def _checked(
        cls, kind: Literal["latest", "specific"], count: int, versions: tuple[int, ...]
    ) -> VersionPolicy:
        if count < 1 or (kind == "specific" and (not versions or min(versions) < 1)):
            raise ValueError(kind)
        return cls(kind, count, tuple(sorted(set(versions))))

    def select(self, available: Iterable[int]) -> set[int]:
        """The versions to serve among `available` (the complete ones)."""
        present = sorted(set(available))
        if self.kind == "all":
            return set(present)
        if self.kind == "specific":
            return set(present) & set(self.versions)
        return set(present[-self.count :])

    def triton(self) -> dict[str, Any]:
        """The policy in Triton's model-configuration form."""
        if self.kind == "all":
            return {"all": {}}
        if self.kind == "specific":
            return {"specific": {"versions": list(self.versions)}}
        return {"latest": {"num_versions": self.count}}

    def __str__(self) -> str:
        if self.kind == "all":
            return "all"
        if self.kind == "specific":
            return "specific:" + ",".join(map(str, self.versions))
        return f"latest:{self.count}"


def policy_from_config(config: str) -> VersionPolicy | None:
    """The version policy in a load call's `config` parameter (a JSON model configuration, as
    Triton's clients send it), or None when it has none."""
    try:
        document = strict_json.loads(config)
    except strict_json.JSONError as exc:
        raise PolicyError(f"the config parameter is not a JSON model configuration: {exc.message}") from None
    if not isinstance(document, dict):
        raise PolicyError("the config parameter must be a JSON object (a model configuration)")
    value = document.get("version_policy")
    return None if value is None else VersionPolicy.parse(value)
