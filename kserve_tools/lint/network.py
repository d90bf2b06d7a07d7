"""Ours, for the pods: each kustomization rendering an InferenceService on our runtimes (or on
KServe's Triton runtime, ``kserve/triton``) ships a NetworkPolicy selecting its predictor pods
(``serving.kserve.io/inferenceservice``) that admits the server's inference and metrics ports
(or Knative's queue-proxy) only from named namespaces, and nothing from everywhere (TorchServe
runs without token authorization there, Triton without any)."""

from __future__ import annotations

from kserve_tools.lint.base import (
    DEFAULT_MODE,
    ISVC_LABEL,
    MODES,
    OUR_RUNTIME,
    OUR_TRITON_RUNTIME,
    Finding,
    finding,
    mode,
    port,
    server_properties,
)
from kserve_tools.lint.servingruntime import TRITON_PORTS, TRITON_RUNTIME
from kserve_tools.render import Resource

QUEUE_PROXY_PORT = 8012  # Knative's queue-proxy, in front of the container's port


def _admits_only_namespaces(rule: dict, isvc: str) -> bool:
    """An ingress rule whose every peer is a namespace named by label (no other pod-only,
    IP-block or empty peer, which would admit more than one namespace's pods), or this
    InferenceService's own transformer pods (``isvc``'s label and ``component: transformer``,
    its namespace only)."""
    peers = rule.get("from")
    if not peers:
        return False
    for peer in peers:
        pods = (peer.get("podSelector") or {}).get("matchLabels") or {}
        if set(peer) == {"podSelector"} and pods == {ISVC_LABEL: isvc, "component": "transformer"}:
            continue
        labels = (peer.get("namespaceSelector") or {}).get("matchLabels") or {}
        if set(peer) != {"namespaceSelector"} or not labels.get("kubernetes.io/metadata.name"):
            return False
    return True


def network_policy_findings(objects: list[Resource]) -> list[Finding]:
    """Each InferenceService on our runtime among ``objects`` (one rendered target) needs a
    NetworkPolicy there selecting its pods, with every ingress rule admitting named
    namespaces only, on the inference port (8080, or Knative's queue-proxy 8012) and the
    metrics port."""
    found: list[Finding] = []
    policies = [r for r in objects if r.kind == "NetworkPolicy"]
    properties = server_properties()
    for isvc in (r for r in objects if r.kind == "InferenceService"):
        model = ((isvc.obj.get("spec") or {}).get("predictor") or {}).get("model") or {}
        if model.get("runtime") not in (OUR_RUNTIME, OUR_TRITON_RUNTIME, TRITON_RUNTIME.name):
            continue
        # Both Triton runtimes serve on the same ports (tritonruntime checks ours' args).
        triton = model.get("runtime") in (OUR_TRITON_RUNTIME, TRITON_RUNTIME.name)
        knative = (
            MODES.get(
                mode((isvc.obj.get("metadata") or {}).get("annotations") or {}) or DEFAULT_MODE
            )
            == "Knative"
        )
        own = TRITON_PORTS["inference"] if triton else port(properties["inference_address"])
        inference = QUEUE_PROXY_PORT if knative else own
        needed = {TRITON_PORTS["metrics"] if triton else port(properties["metrics_address"])}
        selecting = [
            p
            for p in policies
            if (
                ((p.obj.get("spec") or {}).get("podSelector") or {}).get("matchLabels") or {}
            ).items()
            <= {ISVC_LABEL: isvc.name}.items()
            and "Ingress" in ((p.obj.get("spec") or {}).get("policyTypes") or [])
        ]
        if not selecting:
            found.append(
                finding(
                    isvc,
                    "<NetworkPolicy>",
                    "no NetworkPolicy selects this "
                    f"InferenceService's pods ({ISVC_LABEL}: {isvc.name}) while "
                    "the server runs without token authorization",
                    "keep kserve/base/networkpolicy.yaml in the kustomization",
                )
            )
            continue
        for policy in selecting:
            rules = (policy.obj.get("spec") or {}).get("ingress") or []
            ports = set()
            for i, rule in enumerate(rules):
                if not _admits_only_namespaces(rule, isvc.name):
                    found.append(
                        finding(
                            policy,
                            f"spec.ingress[{i}].from",
                            "admits more than named namespaces",
                            "name each namespace with "
                            "namespaceSelector.matchLabels"
                            ".kubernetes.io/metadata.name",
                        )
                    )
                ports |= {p.get("port") for p in rule.get("ports") or []}
            for missing in sorted((needed | {inference}) - ports):
                found.append(
                    finding(
                        policy,
                        "spec.ingress",
                        f"port {missing} is admitted from no namespace",
                        "add a rule for it (namespaces.env)",
                    )
                )
    return found
