"""JSON schemas for the two KServe resources we ship, written down from KServe's published CRDs.

Source: the `openAPIV3Schema` of `serving.kserve.io_servingruntimes.yaml` (v1alpha1) and
`serving.kserve.io_inferenceservices.yaml` (v1beta1) in KServe's `config/crd/full`. The fields
this project uses are typed as the CRDs type them; the other fields the CRDs define are allowed
as objects or scalars; anything else is rejected (the API server would drop it silently). Where a
CRD embeds a Kubernetes type (Container, Volume, PodSpec fields, ObjectMeta) the schema refers to
the strict Kubernetes definitions that kubernetes-validate ships, so those parts are checked field
by field as well.
"""

from __future__ import annotations

from typing import Any

CORE = "#/$defs/io.k8s.api.core.v1."
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
INT32 = {"type": "integer", "minimum": -(2**31), "maximum": 2**31 - 1}
# KServe's InferenceServiceProtocol values (pkg/constants).
PROTOCOLS = {"enum": ["v1", "v2", "grpc-v1", "grpc-v2"]}


def _ref(kind: str) -> dict[str, str]:
    return {"$ref": CORE + kind}


def _array_of(kind: str) -> dict[str, Any]:
    return {"type": "array", "items": _ref(kind)}


def _object(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


def _resource(api_version: str, kind: str, spec: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    schema = _object(
        {
            "apiVersion": {"const": api_version},
            "kind": {"const": kind},
            "metadata": {"$ref": "#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"},
            "spec": spec,
        },
        required=("apiVersion", "kind", "metadata", "spec"),
    )
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$defs": defs["$defs"], **schema}


def serving_runtime(defs: dict[str, Any]) -> dict[str, Any]:
    """serving.kserve.io/v1alpha1 ServingRuntime."""
    model_format = _object(
        {
            "name": {"type": "string"},
            "version": {"type": "string"},
            "autoSelect": {"type": "boolean"},
            "priority": {"type": "integer", "minimum": 1},
        },
        required=("name",),
    )
    spec = _object(
        {
            "supportedModelFormats": {"type": "array", "items": model_format},
            "protocolVersions": {"type": "array", "items": PROTOCOLS},
            "multiModel": {"type": "boolean"},
            "disabled": {"type": "boolean"},
            "containers": {**_array_of("Container"), "minItems": 1},
            "volumes": _array_of("Volume"),
            "imagePullSecrets": _array_of("LocalObjectReference"),
            "tolerations": _array_of("Toleration"),
            "affinity": _ref("Affinity"),
            "nodeSelector": STRING_MAP,
            "annotations": STRING_MAP,
            "labels": STRING_MAP,
            "replicas": {"type": "integer"},
            "hostIPC": {"type": "boolean"},
            **dict.fromkeys(
                ("grpcEndpoint", "grpcDataEndpoint", "httpDataEndpoint", "schedulerName"), {"type": "string"}
            ),
            **dict.fromkeys(("builtInAdapter", "storageHelper", "workerSpec"), {"type": "object"}),
            "resourceClaims": {"type": "array"},
        },
        required=("containers",),
    )
    return _resource("serving.kserve.io/v1alpha1", "ServingRuntime", spec, defs)


def _container_fields(defs: dict[str, Any]) -> dict[str, Any]:
    """A Container's fields without the required name: KServe inlines them into `model`."""
    return dict(defs["$defs"]["io.k8s.api.core.v1.Container"]["properties"])


def _pod_fields(defs: dict[str, Any]) -> dict[str, Any]:
    """A PodSpec's fields: KServe inlines them into each component (containers optional there)."""
    return dict(defs["$defs"]["io.k8s.api.core.v1.PodSpec"]["properties"])


# Fields of KServe's ComponentExtensionSpec, inlined into the predictor next to the PodSpec.
def _component_extension() -> dict[str, Any]:
    return {
        "minReplicas": {**INT32, "minimum": 0},
        "maxReplicas": {**INT32, "minimum": 0},
        "scaleTarget": INT32,
        "scaleMetric": {"enum": ["cpu", "memory", "concurrency", "rps"]},
        "scaleMetricType": {"enum": ["Utilization", "Value", "AverageValue"]},
        "containerConcurrency": {"type": "integer"},
        "timeout": {"type": "integer"},
        "canaryTrafficPercent": {"type": "integer"},
        "labels": STRING_MAP,
        "annotations": STRING_MAP,
        "storageUris": {"type": "array"},
        **dict.fromkeys(
            ("deploymentStrategy", "autoScaling", "batcher", "logger", "workerSpec"), {"type": "object"}
        ),
    }


FRAMEWORKS = (
    "huggingface", "lightgbm", "onnx", "paddle", "pmml",
    "pytorch", "sklearn", "tensorflow", "triton", "xgboost",
)  # fmt: skip


def inference_service(defs: dict[str, Any]) -> dict[str, Any]:
    """serving.kserve.io/v1beta1 InferenceService."""
    model = _object(
        {
            **_container_fields(defs),
            "modelFormat": _object({"name": {"type": "string"}, "version": {"type": "string"}}, ("name",)),
            "runtime": {"type": "string"},
            "runtimeVersion": {"type": "string"},
            "protocolVersion": PROTOCOLS,
            "storageUri": {"type": "string"},
            "storage": {"type": "object"},
            "confidential": {"type": "boolean"},
        }
    )
    predictor = _object(
        {
            **_pod_fields(defs),
            **_component_extension(),
            **dict.fromkeys(FRAMEWORKS, {"type": "object"}),
            "storageContainerName": {"type": "string"},
            "name": {"type": "string"},
            "model": model,
        }
    )
    spec = _object(
        {"predictor": predictor, **dict.fromkeys(("transformer", "explainer", "canary"), {"type": "object"})},
        required=("predictor",),
    )
    return _resource("serving.kserve.io/v1beta1", "InferenceService", spec, defs)
