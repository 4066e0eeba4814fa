//! The binary's front door: `check-config` accepts the shipped file and names the field and the
//! file in errors.

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
    let dir = std::env::temp_dir().join(format!("goodput-proxy-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
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
        let path = dir.join(name);
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
    let _ = std::fs::remove_dir_all(&dir);
}
