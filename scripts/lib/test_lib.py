"""Self-tests of the e2e helpers' pure parts (standard library only).

    python3 -m unittest discover -s scripts/lib -p 'test_*.py'
"""
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_check import nearest_rank  # noqa: E402
from passthrough import parse_response, without_usage  # noqa: E402
from promtext import bucket_delta, buckets, histogram_quantile, metric_sum  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures", "vllm-0.32")

METRICS = """# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.3",model_name="tiny"} 2.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.5",model_name="tiny"} 6.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="tiny"} 8.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="tiny"} 0.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="tiny"} 7.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="tiny"} 1.0
"""


def body_of(name):
    """A capture's body (the fixtures hold it already de-chunked)."""
    raw = open(os.path.join(FIXTURES, name), "rb").read()
    return raw[raw.index(b"\r\n\r\n") + 4:]


class Lib(unittest.TestCase):
    def test_nearest_rank(self):
        v = list(range(1, 101))
        self.assertEqual(nearest_rank(v, 0.5), 50)
        self.assertEqual(nearest_rank(v, 0.99), 99)
        self.assertEqual(nearest_rank([3.0], 0.99), 3.0)
        self.assertIsNone(nearest_rank([], 0.5))

    def test_metric_sum_filters_labels(self):
        self.assertEqual(metric_sum(METRICS, "vllm:request_success_total"), 8.0)
        self.assertEqual(metric_sum(METRICS, "vllm:request_success_total", {"finished_reason": "abort"}), 0.0)

    def test_histogram_quantile_like_promql(self):
        cum = buckets(METRICS, "vllm:e2e_request_latency_seconds", {"model_name": "tiny"})
        self.assertEqual(cum[-1][1], 8.0)
        # rank 4 of 8 lies halfway through (0.3, 0.5]
        self.assertAlmostEqual(histogram_quantile(0.5, cum), 0.4)
        # rank in the +Inf bucket: the highest finite bound
        self.assertEqual(histogram_quantile(0.99, cum), 0.5)
        self.assertIsNone(histogram_quantile(0.5, bucket_delta(cum, cum)))

    def test_parse_response_dechunks(self):
        raw = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n1;x=y\r\n!\r\n0\r\n\r\n"
        status, hdrs, body = parse_response(raw)
        self.assertEqual((status, body), (200, b"hello!"))
        self.assertEqual(hdrs, [("transfer-encoding", "chunked")])

    def test_without_usage_gives_the_capture_without_usage(self):
        # stream-chat-usage.txt minus its usage chunk, fingerprint back on the finish chunk, has the
        # shape of stream-chat.txt: last data event before [DONE] carries the fingerprint
        with_usage = body_of("stream-chat-usage.txt")
        out = without_usage(with_usage)
        self.assertNotIn(b'"usage"', out)
        # byte for byte the plain capture (same seed, same tokens), once ids and times are masked
        mask = lambda b: re.sub(rb"chatcmpl-[0-9a-f]+", b"ID", re.sub(rb'"created":\d+', b"T", b))
        self.assertEqual(mask(out), mask(body_of("stream-chat.txt")))
        events = [e for e in out.split(b"\n\n") if e]
        self.assertEqual(events[-1], b"data: [DONE]")
        self.assertTrue(events[-2].endswith(b',"system_fingerprint":"vllm-0.32.0-f1283a03"}'))

    def test_without_usage_n2_puts_the_fingerprint_on_every_finish_chunk(self):
        with_usage = body_of("stream-chat-n2.txt")
        out = without_usage(with_usage)
        finishes = [e for e in out.split(b"\n\n") if b'"finish_reason":"length"' in e]
        self.assertEqual(len(finishes), 2)
        self.assertTrue(all(e.endswith(b'"system_fingerprint":"vllm-0.32.0-f1283a03"}') for e in finishes))

    def test_without_usage_keeps_what_an_engine_forcing_usage_sends_anyway(self):
        body = body_of("options/force-stream-chat.txt")
        self.assertEqual(without_usage(body), body)

    def test_without_usage_removes_the_metrics_chunk_of_a_client_that_did_not_ask(self):
        # --enable-per-request-metrics: the usage chunk carries metrics after the fingerprint;
        # without usage asked the engine ends as options/metrics-stream-chat.txt does.
        out = without_usage(body_of("options/metrics-stream-chat-usage.txt"))
        self.assertNotIn(b'"metrics"', out)
        tail = lambda b: [e[-80:] for e in b.split(b"\n\n") if e][-2:]
        self.assertEqual(tail(out), tail(body_of("options/metrics-stream-chat.txt")))


if __name__ == "__main__":
    unittest.main()
