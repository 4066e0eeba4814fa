//! The SQL of `report --clickhouse`: exact percentiles by DESIGN.md's definition (numpy's
//! linear interpolation between closest ranks) computed in ClickHouse from
//! `arraySort(groupArray(...))`, which every version from 18.16 on runs. (`quantileExact`
//! picks an element instead; `quantileExactInclusive`, 20.x and later, equals numpy.)
//! config/clickhouse/queries.sql spells out the same expressions; a test keeps them equal.

use goodput_measure::outcome::Outcome;

/// The quantiles the report shows.
pub const QUANTILES: [f64; 3] = [0.5, 0.9, 0.99];

/// numpy's `percentile(x, 100 * q)` for each q of `qs`, over `x`, a sorted `Array(Float64)`
/// expression; NULL for an empty array. Operation for operation what `measure::stats::
/// percentile` does (so the figures are equal to the last bit): with `m = n - 1`, `h = m * q`,
/// `lo = min(floor(h), m)`, `hi = min(lo + 1, m)`, `f = h - lo`, `a = x[lo]`, `b = x[hi]`:
/// numpy's `_lerp`, `b - (b - a) * (1 - f)` when `f >= 0.5`, else `a + (b - a) * f`.
/// ClickHouse arrays are 1-based; `greatest(n, 1)` keeps `m` from wrapping below 0 for an
/// empty array (ClickHouse evaluates both branches of `if`).
pub fn numpy_percentiles(x: &str, qs: &[f64]) -> String {
    let m = format!("(greatest(length({x}), 1) - 1)");
    let lo = format!("least(toUInt64(floor({m} * q)), {m})");
    let hi = format!("least({lo} + 1, {m})");
    let f = format!("({m} * q - {lo})");
    let (a, b) = (format!("{x}[{lo} + 1]"), format!("{x}[{hi} + 1]"));
    let qs: Vec<String> = qs.iter().map(|q| format!("{q}")).collect();
    format!(
        "arrayMap(q -> if(empty({x}), NULL, if({f} >= 0.5, {b} - ({b} - {a}) * (1 - {f}), {a} + ({b} - {a}) * {f})), [{}])",
        qs.join(", ")
    )
}

/// The sorted values of one latency over the group, as `AS name`: every outcome but
/// `rejected`, where defined; TPOT takes one value per choice (`tpot_values_s`).
pub fn latency_array(name: &str) -> String {
    if name == "tpot" {
        "arraySort(groupArrayArrayIf(tpot_values_s, outcome != 'rejected')) AS tpot".into()
    } else {
        format!("arraySort(groupArrayIf({name}_s, outcome != 'rejected' AND isNotNull({name}_s))) AS {name}")
    }
}

/// The window filter on a records table.
pub fn window_filter(window_s: u64) -> String {
    format!("time >= now() - INTERVAL {window_s} SECOND")
}

/// One row per `(model, upstream)` (or one row for the whole fleet when `by_group` is false)
/// over the records that started in the last `window_s` seconds: counts, outcomes, good,
/// client-caused rejections, and p50/p90/p99 of TTFT, TPOT, E2E in seconds. Latencies leave
/// out `rejected` requests (DESIGN.md). `FINAL` collapses rows a retried batch duplicated.
pub fn report_query(db: &str, table: &str, window_s: u64, by_group: bool) -> String {
    let outcomes: Vec<String> = Outcome::ALL
        .iter()
        .map(|o| format!("countIf(outcome = '{0}') AS {0}", o.as_str()))
        .collect();
    let arrays: Vec<String> = ["ttft", "tpot", "e2e"]
        .iter()
        .map(|m| latency_array(m))
        .collect();
    let pcts: Vec<String> = ["ttft", "tpot", "e2e"]
        .iter()
        // `length(x)` outside the lambda: 18.16 drops a subquery column only a lambda reads.
        .map(|m| {
            format!(
                "length({m}) AS {m}_count, {} AS {m}_p",
                numpy_percentiles(m, &QUANTILES)
            )
        })
        .collect();
    let (keys, group) = if by_group {
        ("model, upstream", "GROUP BY model, upstream ")
    } else {
        ("'*' AS model, '*' AS upstream", "")
    };
    format!(
        "SELECT model, upstream, requests, good, rejected_by_client, {outs}, {pcts} FROM (\
         SELECT {keys}, count() AS requests, sum(slo_good) AS good, \
         sum(rejected_by_client) AS rejected_by_client, {outcomes}, {arrays} \
         FROM {db}.{table} FINAL WHERE {filter} {group}) ORDER BY model, upstream FORMAT JSONEachRow",
        outs = Outcome::ALL.map(|o| o.as_str()).join(", "),
        pcts = pcts.join(", "),
        outcomes = outcomes.join(", "),
        arrays = arrays.join(", "),
        filter = window_filter(window_s),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_sql_uses_the_same_percentile_expression() {
        let text = include_str!("../../config/clickhouse/queries.sql");
        for m in ["ttft", "tpot", "e2e"] {
            let expr = numpy_percentiles(m, &QUANTILES);
            assert!(text.contains(&expr), "queries.sql lacks {expr}");
        }
    }

    #[test]
    fn report_query_shape() {
        let q = report_query("goodput", "records", 300, true);
        assert!(q.contains("FROM goodput.records FINAL WHERE time >= now() - INTERVAL 300 SECOND GROUP BY model, upstream"));
        assert!(q.contains("countIf(outcome = 'client_abort') AS client_abort"));
        assert!(q.ends_with("FORMAT JSONEachRow"));
        let fleet = report_query("goodput", "records", 60, false);
        assert!(fleet.contains("'*' AS model") && !fleet.contains("GROUP BY"));
        assert_eq!(numpy_percentiles("x", &[0.5]).matches("[0.5]").count(), 1);
    }
}
