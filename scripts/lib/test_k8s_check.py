"""Self-tests of the Kubernetes kit checker: the kit passes, and each consistency rule catches
the mistake it is for. Needs PyYAML and kubernetes-validate (.ci/run installs them); skipped
without them.

    python3 -m unittest discover -s scripts/lib -p 'test_*.py'
"""
import copy
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import k8s_check  # noqa: E402
except ImportError:  # no yaml / kubernetes_validate on this machine
    k8s_check = None

KIT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "config", "kubernetes")


@unittest.skipUnless(k8s_check, "needs PyYAML and kubernetes-validate")
class KubernetesKit(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from pathlib import Path
        cls.docs = k8s_check.load(Path(KIT))

    def variant(self, name):
        return [(f, copy.deepcopy(d)) for f, d in self.docs if f.startswith(name + "/")]

    def find(self, docs, kind, name=None):
        return next(d for _, d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name))

    def test_the_kit_passes(self):
        from pathlib import Path
        self.assertEqual(k8s_check.check(Path(KIT), None), [])

    def test_a_wrong_field_fails_the_schema(self):
        docs = self.variant("sidecar")
        self.find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][1]["readinessProbe"]["httpGet"]["prot"] = 1
        self.assertTrue(k8s_check.schema_errors(docs))

    def test_drain_longer_than_the_grace_period_fails(self):
        docs = self.variant("sidecar")
        self.find(docs, "Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 30
        errors, _ = k8s_check.check_variant(docs, None)
        self.assertTrue(any("terminationGracePeriodSeconds" in e for e in errors), errors)

    def test_an_engine_that_leaves_before_the_drain_ends_fails(self):
        docs = self.variant("sidecar")
        vllm = self.find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
        vllm["lifecycle"]["preStop"]["sleep"]["seconds"] = 10
        errors, _ = k8s_check.check_variant(docs, None)
        self.assertTrue(any("preStop" in e for e in errors), errors)

    def test_the_admin_token_secret_must_exist_and_hold_a_digest(self):
        for variant in ("sidecar", "shared-ingress"):
            docs = self.variant(variant)
            self.find(docs, "Secret", "goodput-proxy-admin")["stringData"]["token-sha256"] = "hunter2"
            errors, _ = k8s_check.check_variant(docs, None)
            self.assertTrue(any("not a SHA-256 digest" in e for e in errors), errors)
            docs = [(f, d) for f, d in self.variant(variant) if d["kind"] != "Secret"]
            errors, _ = k8s_check.check_variant(docs, None)
            self.assertTrue(any("does not define" in e for e in errors), errors)

    def test_probes_must_be_on_the_admin_port(self):
        docs = self.variant("shared-ingress")
        c = self.find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
        c["readinessProbe"]["httpGet"]["port"] = "http"
        errors, _ = k8s_check.check_variant(docs, None)
        self.assertTrue(any("readinessProbe" in e for e in errors), errors)

    def test_a_servicemonitor_on_the_wrong_port_fails(self):
        docs = self.variant("shared-ingress")
        self.find(docs, "ServiceMonitor")["spec"]["endpoints"][0]["port"] = "http"
        errors, _ = k8s_check.check_variant(docs, None)
        self.assertTrue(any("admin port" in e for e in errors), errors)

    def test_an_hpa_metric_without_adapter_rule_fails(self):
        docs = [(f, copy.deepcopy(d)) for f, d in self.docs]
        hpa = self.find(docs, "HorizontalPodAutoscaler", "vllm")
        hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] = "cpu_demand"
        errors = k8s_check.check_autoscaling(docs, {("Deployment", "vllm"), ("StatefulSet", "vllm")})
        self.assertTrue(any("no adapter rule" in e for e in errors), errors)


if __name__ == "__main__":
    unittest.main()
