"""Every recording rule and alert of config/prometheus-rules.yml has a promtool unit test in
config/prometheus-rules.test.yml (promtool itself runs them: `promtool test rules ...`).

    python3 -m unittest discover -s scripts/lib -p 'test_*.py'
"""
import os
import re
import unittest

CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "config")


class EveryRuleIsTested(unittest.TestCase):
    def test_each_record_and_alert_appears_in_a_test(self):
        with open(os.path.join(CONFIG, "prometheus-rules.yml")) as f:
            rules = f.read()
        with open(os.path.join(CONFIG, "prometheus-rules.test.yml")) as f:
            tests = f.read()
        records = re.findall(r"^\s*- record:\s*(\S+)", rules, re.M)
        alerts = re.findall(r"^\s*- alert:\s*(\S+)", rules, re.M)
        self.assertTrue(records and alerts)
        tested_exprs = set(re.findall(r"^\s*- expr:\s*(\S+)\s*$", tests, re.M))
        tested_alerts = set(re.findall(r"^\s*alertname:\s*(\S+)", tests, re.M))
        self.assertEqual(sorted(set(records) - tested_exprs), [])
        self.assertEqual(sorted(set(alerts) - tested_alerts), [])


if __name__ == "__main__":
    unittest.main()
