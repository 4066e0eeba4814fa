//! The binary's front door: `check-config` accepts the shipped file, and lists every problem of
//! a bad one, each naming its field and where the value came from.

use std::process::Command;

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_goodput-proxy"));
    // The caller's environment must not change what the file says.
    for (k, _) in std::env::vars() {
        if k.starts_with("GOODPUT_PROXY_") {
            c.env_remove(k);
        }
    }
    c
}

#[test]
fn check_config_accepts_the_shipped_config() {
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/config/goodput-proxy.toml");
    let out = bin().args(["check-config", file]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok"));
}

#[test]
fn check_config_errors_name_field_and_file() {
    let dir = crate::support::temp_dir("proxy-cli");
    let cases = [
        (
            "unknown.toml",
            "[server]\nlisten_adress = \"127.0.0.1:1\"\n",
            "listen_adress",
        ),
        (
            "invalid.toml",
            "[upstream]\nurls = [\"ftp://x\"]\n",
            "upstream.urls",
        ),
        (
            "type.toml",
            "[server]\nmax_in_flight = \"lots\"\n",
            "max_in_flight",
        ),
    ];
    for (name, text, field) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let out = bin().arg("check-config").arg(&path).output().unwrap();
        assert!(!out.status.success(), "{name} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(field), "{name}: {err}");
        assert!(err.contains(name), "{name}: {err}");
    }
    let out = bin()
        .args([
            "check-config",
            concat!(env!("CARGO_MANIFEST_DIR"), "/config/goodput-proxy.toml"),
        ])
        .env("GOODPUT_PROXY_SERVER_MAX_IN_FLIGHT", "lots")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("GOODPUT_PROXY_SERVER_MAX_IN_FLIGHT"));
}

#[test]
fn check_config_lists_every_problem_each_with_its_field_and_source() {
    let dir = crate::support::temp_dir("proxy-cli3");
    let path = dir.path().join("three.toml");
    // Three mistakes in the file (an unknown key, a wrong type, a value out of range) and one
    // in the environment.
    let text = "[server]\nlisten_adress = \"127.0.0.1:1\"\nmax_in_flight = 0\n\
                [upstream]\nconnect_timeout_ms = \"5s\"\n";
    std::fs::write(&path, text).unwrap();
    let out = bin().arg("check-config").arg(&path).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "accepted: {err}");
    let file = path.display().to_string();
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("field `")).collect();
    let fields = [
        "server.listen_adress",
        "upstream.connect_timeout_ms",
        "server.max_in_flight",
    ];
    assert_eq!(lines.len(), 3, "{err}");
    for (line, field) in lines.iter().zip(fields) {
        assert!(
            line.starts_with(&format!("{file}: field `{field}`: ")),
            "{line}"
        );
    }
    assert!(err.contains("3 problem(s)"), "{err}");
    let out = bin()
        .arg("check-config")
        .arg(&path)
        .env("GOODPUT_PROXY_UPSTREAM_CONNECT_TIMEOUT_MS", "100")
        .env("GOODPUT_PROXY_ENGINE_SCRAPE", "maybe")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("field `")).collect();
    assert_eq!(
        lines.len(),
        3,
        "the variable fixed one, broke another: {err}"
    );
    assert!(
        lines[0].starts_with(
            "environment variable GOODPUT_PROXY_ENGINE_SCRAPE: field `engine.scrape`: "
        ),
        "{err}"
    );
}
