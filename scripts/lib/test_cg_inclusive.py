"""cg_inclusive: names line up across builds, a function seen under two files counts once."""
import unittest

import cg_inclusive

ANNOTATE = """\
--------------------------------------------------------------------------------
Ir                    file:function
--------------------------------------------------------------------------------
  1,000 (100.0%)  PROGRAM TOTALS
    900 (90.00%)  /a/src/recorder/body.rs:<goodput_proxy::recorder::body::MeteredBody as http_body::Body>::poll_frame [/tmp/x/base]
    900 (90.00%)  /rustc/abc/library/alloc/src/boxed.rs:<goodput_proxy::recorder::body::MeteredBody as http_body::Body>::poll_frame
    700 (70.00%)  >   /a/crates/measure/src/meter/strip.rs:strip_frame (3x)
    400 (40.00%)  /a/crates/measure/src/meter.rs:goodput_measure::meter::Timeline::on_info::h0123456789abcdef [/tmp/x/base]
"""


class Parse(unittest.TestCase):
    def test_one_cost_per_function_callers_lines_left_out(self):
        costs = cg_inclusive.parse(ANNOTATE)
        mb = "<goodput_proxy::recorder::body::MeteredBody as http_body::Body>::poll_frame"
        self.assertEqual(costs[mb], 900)
        self.assertEqual(costs["goodput_measure::meter::Timeline::on_info"], 400)
        self.assertEqual(costs["PROGRAM TOTALS"], 1000)
        self.assertFalse(any(k.startswith("=>") or k.startswith(">") for k in costs))
        self.assertNotIn("strip_frame (3x)", costs)


if __name__ == "__main__":
    unittest.main()
