//! Outputs of a run: `requests.jsonl`, `summary.json`, `report.html`, the terminal table, and
//! their comparison section (`compare`: the client's view against the proxy's and the engines').

pub mod charts;
pub mod compare;
pub mod html;
pub mod summary;
pub mod table;
pub mod tool_calls;

use std::io::Write as _;
use std::path::Path;

use crate::record::RequestRecord;
pub use summary::{PhaseSummary, PhaseWindow, Stats, Summary};

/// Write the three files into `dir` (created if missing).
pub fn write_all(
    dir: &Path,
    summary: &Summary,
    windows: &[PhaseWindow],
    records: &[RequestRecord],
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut f = std::io::BufWriter::new(std::fs::File::create(dir.join("requests.jsonl"))?);
    for r in records {
        serde_json::to_writer(&mut f, r)?;
        f.write_all(b"\n")?;
    }
    f.flush()?;
    std::fs::write(
        dir.join("summary.json"),
        serde_json::to_vec_pretty(summary)?,
    )?;
    std::fs::write(
        dir.join("report.html"),
        html::render(summary, windows, records),
    )?;
    Ok(())
}
