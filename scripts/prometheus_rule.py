"""Write deploy/observability/prometheusrule.yaml: the Prometheus operator's PrometheusRule with the
groups of deploy/observability/rules.yml (the one source of the rules; promtool checks that file).

Run after editing rules.yml: `python scripts/prometheus_rule.py`; tests/deploy/test_observability.py
fails while the two differ.
"""

from __future__ import annotations

from pathlib import Path

import yaml

OBSERVABILITY = Path(__file__).resolve().parents[1] / "deploy" / "observability"
HEADER = (
    "# Generated from rules.yml by scripts/prometheus_rule.py: edit rules.yml, then run it.\n"
    "# The Prometheus operator's form of the rules (kubectl apply -k deploy/k8s/observability).\n"
)


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the PromQL) as literal blocks, as rules.yml writes them."""


def _string(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_Dumper.add_representer(str, _string)


def prometheus_rule() -> str:
    groups = yaml.safe_load((OBSERVABILITY / "rules.yml").read_text())["groups"]
    document = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "gmlp-serve", "labels": {"app.kubernetes.io/name": "gmlp-serve"}},
        "spec": {"groups": groups},
    }
    return HEADER + yaml.dump(document, Dumper=_Dumper, sort_keys=False, width=100)


def main() -> None:
    (OBSERVABILITY / "prometheusrule.yaml").write_text(prometheus_rule())


if __name__ == "__main__":
    main()
