"""Self-tests of the dashboard checker's pure parts, and of the dashboard file itself.

    python3 -m unittest discover -s scripts/lib -p 'test_*.py'
"""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dashboard_check import (  # noqa: E402
    MIXED_COVERAGE, expected_upstreams, judge, metric_names, operands, panel_queries,
    substitute, upstreams_by_name, variable_queries)

DASHBOARD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "config",
                         "grafana", "goodput-proxy.json")


def ok(rows, kind="vector"):
    return {"status": "success", "data": {"resultType": kind, "result": rows}}


def row(value, **labels):
    return {"metric": labels, "value": [1.0, str(value)]}


class Substitution(unittest.TestCase):
    def test_both_forms_and_rate_interval(self):
        v = {"model": ".*", "__rate_interval": "4s"}
        self.assertEqual(substitute('rate(x{model=~"$model"}[$__rate_interval])', v),
                         'rate(x{model=~".*"}[4s])')
        self.assertEqual(substitute('x{model=~"${model}"}', v), 'x{model=~".*"}')

    def test_an_unknown_variable_is_an_error(self):
        with self.assertRaises(KeyError):
            substitute('x{upstream=~"$upstream"}', {"model": ".*"})


class Extraction(unittest.TestCase):
    def test_nested_row_panels_and_label_values(self):
        d = {"panels": [
            {"title": "a", "targets": [{"refId": "A", "expr": "up"}, {"refId": "B"}]},
            {"type": "row", "title": "r", "panels": [
                {"title": "b", "targets": [{"refId": "A", "expr": "x", "legendFormat": "{{upstream}}"}]}]},
            {"type": "text", "title": "t"}],
            "templating": {"list": [
                {"type": "datasource", "name": "datasource"},
                {"type": "query", "name": "model", "query": {"query": "label_values(m_total, model)"}}]}}
        qs = panel_queries(d)
        self.assertEqual([(q.panel, q.ref, q.expr) for q in qs], [("a", "A", "up"), ("b", "A", "x")])
        self.assertEqual(qs[1].legend, "{{upstream}}")
        self.assertEqual(variable_queries(d), [("model", "model", "count by (model) (m_total)")])

    def test_unsupported_variable_query_is_refused(self):
        d = {"templating": {"list": [{"type": "query", "name": "v", "query": "query_result(up)"}]}}
        with self.assertRaises(ValueError):
            variable_queries(d)


class Judging(unittest.TestCase):
    def test_errors_empty_and_nan_fail(self):
        self.assertIn("error", judge({"status": "error", "errorType": "bad_data", "error": "parse"}, None))
        self.assertEqual(judge(ok([]), None), "no data")
        self.assertEqual(judge(ok([row("NaN")]), None), "only NaN")
        self.assertIsNone(judge(ok([row("NaN"), row(0)]), None))
        self.assertIsNone(judge(ok([1.0, "3"], kind="scalar"), None))
        # The estimate's families are absent until the proxy has seen its limit: empty is
        # fine for them, an error is not.
        self.assertIsNone(judge(ok([]), None, "max(goodput_proxy_desired_replicas)"))
        self.assertIsNone(judge(ok([]), None, "goodput_proxy_headroom_streams"))
        self.assertEqual(judge(ok([]), None, "goodput_proxy_demand"), "no data")
        self.assertIn("error", judge({"status": "error", "errorType": "bad_data", "error": "parse"},
                                     None, "goodput_proxy_headroom_streams"))

    def test_per_upstream_queries_need_every_upstream(self):
        res = ok([row(1, upstream="a"), row("NaN", upstream="b")])
        self.assertIn("['b']", judge(res, {"a", "b"}))
        self.assertIsNone(judge(ok([row(1, upstream="a"), row(0, upstream="b")]), {"a", "b"}))


class TheDashboard(unittest.TestCase):
    """What Grafana needs to import it, and what the issue asks it to have."""

    @classmethod
    def setUpClass(cls):
        with open(DASHBOARD) as f:
            cls.d = json.load(f)

    def test_variables_and_datasource(self):
        names = [v["name"] for v in self.d["templating"]["list"]]
        self.assertEqual(names, ["datasource", "model", "upstream"])
        for q in panel_queries(self.d):
            substitute(q.expr, {"model": ".*", "upstream": ".*", "__rate_interval": "1m"})

    def test_ids_unique_and_every_panel_described(self):
        panels = []
        for p in self.d["panels"]:
            panels.append(p)
            panels.extend(p.get("panels", []))
        ids = [p["id"] for p in panels]
        self.assertEqual(len(ids), len(set(ids)))
        for p in panels:
            if p["type"] not in ("row", "text"):
                self.assertTrue(p.get("description"), p["title"])
                self.assertEqual(p["datasource"]["uid"], "${datasource}", p["title"])

    def test_every_panel_is_in_docs(self):
        with open(os.path.join(os.path.dirname(DASHBOARD), "..", "..", "docs", "dashboard.md")) as f:
            doc = f.read()
        for p in self.d["panels"]:
            if p["type"] != "row":
                self.assertIn(f"**{p['title']}**", doc, p["title"])


class MixedFleet(unittest.TestCase):
    def test_names_of_selectors_and_name_regexes(self):
        e = ('histogram_quantile(0.5, sum by (upstream, le) (rate({__name__=~"vllm:a_bucket|'
             'tgi_b_bucket",model_name=~".*"}[4s]))) - max by (upstream) (goodput_proxy_x{u="1"})')
        self.assertLessEqual({"vllm:a_bucket", "tgi_b_bucket", "goodput_proxy_x"}, metric_names(e))

    def test_expected_upstreams_are_those_serving_a_family_read(self):
        page = ('# TYPE vllm:a histogram\nvllm:a_bucket{le="1",upstream="u1"} 1\n'
                'tgi_b_bucket{upstream="u4",le="+Inf"} 2\nplain 3\n'
                'goodput_proxy_x{upstream="u1"} 1\ngoodput_proxy_x{upstream="u4"} 0\n')
        served = upstreams_by_name(page)
        self.assertEqual(served["goodput_proxy_x"], {"u1", "u4"})
        self.assertNotIn("plain", served)
        self.assertEqual(expected_upstreams('rate({__name__=~"vllm:a_bucket|x"}[1m])', served),
                         {"u1"})
        self.assertEqual(expected_upstreams("goodput_proxy_x", served), {"u1", "u4"})

    def test_a_difference_expects_the_replicas_of_both_sides(self):
        e = ('histogram_quantile(0.95, sum by (upstream, le) (rate(p_bucket{a="x - y"}[4s]))) - '
             'histogram_quantile(0.95, sum by (upstream, le) (rate(e_bucket[4s])))')
        self.assertEqual(len(operands(e)), 2)
        self.assertEqual(operands("a - b - c"), ["a", "b", "c"])
        self.assertEqual(operands("f(a - b)"), ["f(a - b)"])
        served = {"p_bucket": {"u1", "u2"}, "e_bucket": {"u2"}}
        self.assertEqual(expected_upstreams(e, served), {"u2"})

    def test_covered_panels_exist(self):
        with open(DASHBOARD) as f:
            titles = {q.panel for q in panel_queries(json.load(f))}
        for title in MIXED_COVERAGE:
            self.assertIn(title, titles)


if __name__ == "__main__":
    unittest.main()
