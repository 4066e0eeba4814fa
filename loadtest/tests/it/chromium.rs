//! `report.html` opens in headless Chromium and shows its charts. Needs a `chromium` binary
//! (Debian: `apt-get install -y chromium`; or set `CHROMIUM=/path`), hence `#[ignore]`:
//!   cargo test -p goodput-loadtest --test it chromium -- --ignored
//! Set `LOADTEST_SCREENSHOT=path.png` to keep the screenshot.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use goodput_loadtest::runner::{self, CompareTargets, RunConfig};
use goodput_loadtest::scenario::Scenario;
use goodput_sim::{SimConfig, SimServer};

fn chromium(args: &[&str], profile: &Path) -> std::process::Output {
    let bin = std::env::var("CHROMIUM").unwrap_or_else(|_| "chromium".into());
    let mut all = vec![
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
    ];
    all.extend_from_slice(args);
    Command::new(bin)
        .args(all)
        .arg(format!("--user-data-dir={}", profile.display()))
        .output()
        .expect("chromium runs (install it or set CHROMIUM)")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a chromium binary"]
async fn report_opens_in_headless_chromium_and_shows_its_charts() {
    let sim = SimServer::bind(
        SimConfig::with_timing(30.0, 5.0),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap()
    .spawn();
    let sc = Scenario::parse(
        r#"
        [mix]
        max_tokens = { uniform = [4, 24] }
        ignore_eos = true
        [[mix.headers]]
        name = "x-sim-fault"
        value = "truncate-after=2"
        share = 0.1
        [[phases]]
        name = "calm"
        duration_s = 1.0
        arrivals = { constant = { rate = 20 } }
        [[phases]]
        name = "busy"
        duration_s = 1.0
        arrivals = { poisson = { rate = 80 } }
    "#,
    )
    .unwrap();
    let res = tokio::time::timeout(
        Duration::from_secs(30),
        runner::run(RunConfig {
            target: sim.base_url(),
            scenario: sc,
            scenario_name: "chromium".into(),
            show_progress: false,
            metrics: None,
            compare: CompareTargets::default(),
            run_id: "chromium".into(),
        }),
    )
    .await
    .unwrap()
    .unwrap();
    sim.shutdown().await;
    let dir =
        std::env::temp_dir().join(format!("goodput-loadtest-chromium-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    goodput_loadtest::report::write_all(&dir, &res.summary, &res.windows, &res.records).unwrap();
    let url = format!("file://{}", dir.join("report.html").display());
    let profile = dir.join("profile");

    // The DOM Chromium built holds every chart with drawn series.
    let dom = chromium(&["--dump-dom", &url], &profile);
    assert!(
        dom.status.success(),
        "{}",
        String::from_utf8_lossy(&dom.stderr)
    );
    let dom = String::from_utf8_lossy(&dom.stdout);
    assert_eq!(
        dom.matches("<svg").count(),
        7,
        "7 charts in the parsed page"
    );
    assert!(
        dom.matches("<polyline").count() >= 10,
        "CDF and time-series lines drawn"
    );
    assert!(dom.contains("calm") && dom.contains("busy"));

    // And it paints: a blank 1280x1600 page compresses to a few KB, the charts do not.
    let png = dir.join("report.png");
    let shot = chromium(
        &[
            &format!("--screenshot={}", png.display()),
            "--window-size=1280,1600",
            &url,
        ],
        &profile,
    );
    assert!(
        shot.status.success(),
        "{}",
        String::from_utf8_lossy(&shot.stderr)
    );
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[1..4], b"PNG");
    let (w, h) = (
        u32::from_be_bytes(bytes[16..20].try_into().unwrap()),
        u32::from_be_bytes(bytes[20..24].try_into().unwrap()),
    );
    assert_eq!((w, h), (1280, 1600));
    assert!(
        bytes.len() > 60_000,
        "screenshot is {} bytes: blank?",
        bytes.len()
    );
    if let Ok(keep) = std::env::var("LOADTEST_SCREENSHOT") {
        std::fs::copy(&png, keep).unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
}
