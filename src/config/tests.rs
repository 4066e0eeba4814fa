use std::path::Path;
use std::time::Duration;

use super::*;

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Loads `toml` (as the file `f.toml`) with `vars`; the problems, one line each.
fn problems(toml: &str, vars: &[(&str, &str)]) -> Vec<Problem> {
    let mut layers = layers::Layers::text(toml, "f.toml").unwrap();
    let (overrides, problems) = env::overrides(env(vars));
    for p in &problems {
        layers.unset(&p.field, p.origin.clone());
    }
    for o in overrides {
        layers.set(o);
    }
    match finish(&layers, problems) {
        Ok(_) => Vec::new(),
        Err(ConfigError::Invalid(p)) => p,
        Err(other) => panic!("{other}"),
    }
}

#[test]
fn the_defaults_pass() {
    let c = Config::default();
    assert!(c.clickhouse.is_none(), "off by default");
    assert_eq!(c.upstream.total_timeout, None);
    assert_eq!(c.measure.records, 100_000);
    assert!(!c.server.instance.is_empty(), "the hostname");
    let _ = ClickHouseConfig::default();
}

#[test]
fn shipped_configs_pass() {
    let shipped = [
        (
            "config/goodput-proxy.toml",
            include_str!("../../config/goodput-proxy.toml"),
        ),
        (
            "config/kubernetes/sidecar/configmap.yaml",
            include_str!("../../config/kubernetes/sidecar/configmap.yaml"),
        ),
        (
            "config/kubernetes/shared-ingress/configmap.yaml",
            include_str!("../../config/kubernetes/shared-ingress/configmap.yaml"),
        ),
    ];
    for (name, text) in shipped {
        // A ConfigMap holds the file indented under `goodput-proxy.toml: |`.
        let toml = match text.split_once("goodput-proxy.toml: |\n") {
            Some((_, body)) => body
                .lines()
                .map(|l| l.strip_prefix("    ").unwrap_or(l))
                .collect::<Vec<_>>()
                .join("\n"),
            None => text.to_string(),
        };
        if let Err(e) = Config::from_toml(&toml, name) {
            panic!("{e}");
        }
    }
}

#[test]
fn three_mistakes_three_problems_each_naming_its_field() {
    let p = problems(
        "[server]\nmax_in_flight = 0\nlisten_addr = \"x\"\n[upstream]\nconnect_timeout_ms = \"5s\"\n",
        &[],
    );
    let fields: Vec<&str> = p.iter().map(|p| p.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "server.listen_addr",
            "upstream.connect_timeout_ms",
            "server.max_in_flight"
        ],
        "{p:?}"
    );
    assert!(p.iter().all(|p| p.origin == Origin::File("f.toml".into())));
    assert!(p[0].message.contains("unknown field"), "{}", p[0].message);
    assert!(p[1].message.contains("5s"), "{}", p[1].message);
    assert_eq!(
        p[2].to_string(),
        "f.toml: field `server.max_in_flight`: must be positive"
    );
}

#[test]
fn problems_name_their_source() {
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], Vec<(&'a str, Origin)>);
    let file = || Origin::File("f.toml".into());
    let var = |v: &str| Origin::Env(v.into());
    let cases: Vec<Case> = vec![
        // The environment overrides the file; its problem is the variable's.
        (
            "[server]\nmax_in_flight = 0\n",
            &[("GOODPUT_PROXY_SERVER_MAX_IN_FLIGHT", "many")],
            vec![(
                "server.max_in_flight",
                var("GOODPUT_PROXY_SERVER_MAX_IN_FLIGHT"),
            )],
        ),
        (
            "",
            &[("GOODPUT_PROXY_UPSTREAM_URLS", "ftp://a")],
            vec![("upstream.urls", var("GOODPUT_PROXY_UPSTREAM_URLS"))],
        ),
        (
            "[upstream]\nurls = [\"ftp://a\"]\n",
            &[("GOODPUT_PROXY_SERVER_NOPE", "1")],
            vec![
                ("server.nope", var("GOODPUT_PROXY_SERVER_NOPE")),
                ("upstream.urls", file()),
            ],
        ),
        // A serde problem of a value the environment set.
        (
            "",
            &[("GOODPUT_PROXY_SERVER_LISTEN", "nowhere")],
            vec![("server.listen", var("GOODPUT_PROXY_SERVER_LISTEN"))],
        ),
        // A cross-field check on defaults only.
        (
            "[server]\nlisten = \"127.0.0.1:9090\"\n",
            &[],
            vec![("server.admin_listen", Origin::Default)],
        ),
        ("[servr]\na = 1\nb = 2\n", &[], vec![("servr", file())]),
    ];
    for (toml, vars, want) in cases {
        let got: Vec<(String, Origin)> = problems(toml, vars)
            .into_iter()
            .map(|p| (p.field, p.origin))
            .collect();
        let want: Vec<(String, Origin)> = want
            .iter()
            .map(|(f, o)| (f.to_string(), o.clone()))
            .collect();
        assert_eq!(got, want, "{toml} {vars:?}");
    }
}

#[test]
fn env_overrides_apply_over_the_file() {
    let dir = std::env::temp_dir().join(format!("goodput-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("c.toml");
    std::fs::write(
        &file,
        "[server]\nmax_in_flight = 3\n[engine]\nscrape = true\n",
    )
    .unwrap();
    let c = Config::load(
        Some(&file),
        env(&[
            ("GOODPUT_PROXY_SERVER_LISTEN", "0.0.0.0:1234"),
            ("GOODPUT_PROXY_SERVER_MAX_IN_FLIGHT", "7"),
            ("GOODPUT_PROXY_UPSTREAM_URLS", "http://a:1, http://b:2"),
            ("GOODPUT_PROXY_LOG_FORMAT", "json"),
            ("GOODPUT_PROXY_SERVER_TLS_CERT", "/c.pem"),
            ("GOODPUT_PROXY_SERVER_TLS_KEY", "/k.pem"),
            ("GOODPUT_PROXY_ENGINE_SCRAPE", "false"),
            ("GOODPUT_PROXY_MEASURE_SINK_PATH", "/tmp/r.jsonl"),
            ("GOODPUT_PROXY_SLO_TTFT_MS", "700"),
            ("GOODPUT_PROXY_SLO_E2E_MS", "none"),
            ("GOODPUT_PROXY_SINK_CLICKHOUSE_BATCH_SIZE", "500"),
            ("UNRELATED", "x"),
            ("GOODPUT_PROXY_CONFIG", "/etc/goodput-proxy.toml"),
        ]),
        vec![Override {
            field: "server.listen".into(),
            value: toml::Value::String("127.0.0.1:5".into()),
            origin: Origin::Flag("--listen"),
        }],
    )
    .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        c.server.listen.port(),
        5,
        "a flag wins over the environment"
    );
    assert_eq!(c.server.max_in_flight, 7);
    let urls: Vec<&str> = c.upstream.urls.iter().map(BaseUrl::as_str).collect();
    assert_eq!(urls, ["http://a:1", "http://b:2"]);
    assert_eq!(c.log.format, LogFormat::Json);
    assert_eq!(c.server.tls.unwrap().cert, Path::new("/c.pem"));
    assert!(!c.engine.scrape);
    assert_eq!(c.measure.jsonl.unwrap().path, Path::new("/tmp/r.jsonl"));
    assert_eq!(c.slo.default.ttft, Some(Duration::from_millis(700)));
    assert_eq!(c.slo.default.e2e, None);
    assert_eq!(c.clickhouse.unwrap().batch_size, 500);
}

#[test]
fn measure_and_slo_settings() {
    let c = Config::from_toml(
        "[measure]\nusage_injection = \"off\"\nmodels = [\"a\"]\nrecords = 10\n\
         [slo]\nttft_ms = 500\ne2e_ms = \"none\"\n[slo.models.big]\nttft_ms = 4000\n\
         [slo.models.loose]\ntpot_ms = \"none\"\n[slo.models.smooth]\nmax_stall_ms = 2000\n",
        "m.toml",
    )
    .unwrap();
    assert_eq!(c.measure.usage_injection, UsageInjection::Off);
    assert_eq!(c.measure.records, 10);
    let t = &c.slo;
    assert_eq!(t.default.ttft, Some(Duration::from_millis(500)));
    assert_eq!(t.default.tpot, Some(Duration::from_millis(150)));
    assert_eq!(t.default.e2e, None);
    let big = t.for_model("big");
    assert_eq!(big.ttft, Some(Duration::from_secs(4)));
    assert_eq!(big.tpot, t.default.tpot);
    assert_eq!(t.for_model("loose").tpot, None);
    assert_eq!(t.for_model("small"), &t.default);
    // The stall SLO is off unless set, per model too.
    assert_eq!(t.default.max_stall, None);
    assert_eq!(big.max_stall, None);
    let smooth = t.for_model("smooth");
    assert_eq!(smooth.max_stall, Some(Duration::from_secs(2)));
    assert_eq!(smooth.ttft, t.default.ttft);
    let c = Config::from_toml("[slo]\nmax_stall_ms = 1500\n", "s.toml").unwrap();
    assert_eq!(c.slo.default.max_stall, Some(Duration::from_millis(1500)));
}

#[test]
fn a_limit_is_milliseconds_or_none_never_zero() {
    for (toml, field) in [
        ("[slo]\nttft_ms = 0\n", "slo.ttft_ms"),
        (
            "[upstream]\ntotal_timeout_ms = 0\n",
            "upstream.total_timeout_ms",
        ),
        ("[slo.models.a]\ne2e_ms = 0\n", "slo.models.a.e2e_ms"),
        ("[slo]\ntpot_ms = \"off\"\n", "slo.tpot_ms"),
        ("[slo]\ntpot_ms = -1\n", "slo.tpot_ms"),
        ("[slo]\nmax_stall_ms = 0\n", "slo.max_stall_ms"),
        (
            "[slo.models.a]\nmax_stall_ms = 0\n",
            "slo.models.a.max_stall_ms",
        ),
    ] {
        let p = problems(toml, &[]);
        assert_eq!(p.len(), 1, "{toml}: {p:?}");
        assert_eq!(p[0].field, field);
    }
    let c = Config::from_toml("[upstream]\ntotal_timeout_ms = 9000\n", "t.toml").unwrap();
    assert_eq!(c.upstream.total_timeout, Some(Duration::from_secs(9)));
}

#[test]
fn engine_settings() {
    let d = Config::default();
    assert!(d.engine.scrape);
    assert_eq!(d.engine.scrape_interval, Duration::from_secs(5));
    let c = Config::from_toml(
        "[engine]\nscrape = false\nscrape_interval_ms = 250\nupstream_label = \"index\"\n",
        "e.toml",
    )
    .unwrap();
    assert!(!c.engine.scrape);
    assert_eq!(c.engine.scrape_interval, Duration::from_millis(250));
    assert_eq!(c.engine.upstream_label, UpstreamLabel::Index);
}

#[test]
fn engine_kinds_per_replica_and_their_problems() {
    use crate::config::EngineKind;
    assert_eq!(Config::default().engine.kind, None);
    let c = Config::from_toml(
        "[upstream]\nurls = [\"http://a:1\", \"http://b:2/\"]\n\
         [engine]\nkind = \"vllm\"\n[engine.kinds]\n\"http://b:2\" = \"llamacpp\"\n",
        "k.toml",
    )
    .unwrap();
    assert_eq!(c.engine.kind_of("http://a:1"), Some(EngineKind::Vllm));
    assert_eq!(c.engine.kind_of("http://b:2/"), Some(EngineKind::Llamacpp));
    assert_eq!(
        c.engine.kind_of("http://discovered:3"),
        Some(EngineKind::Vllm)
    );
    let auto = Config::from_toml("[upstream]\nurls = [\"http://a:1\"]\n", "a.toml").unwrap();
    assert_eq!(auto.engine.kind_of("http://a:1"), None);
    for (toml, field) in [
        ("[engine]\nkind = \"ollama\"\n", "engine.kind"),
        (
            "[upstream]\nurls = [\"http://a:1\"]\n[engine.kinds]\n\"http://a:1\" = \"VLLM\"\n",
            "engine.kinds.\"http://a:1\"",
        ),
        (
            "[upstream]\nurls = [\"http://a:1\"]\n[engine.kinds]\n\"http://c:3\" = \"tgi\"\n",
            "engine.kinds.\"http://c:3\"",
        ),
    ] {
        let p = problems(toml, &[]);
        assert_eq!(p.len(), 1, "{toml}: {p:?}");
        assert_eq!(p[0].field, field, "{toml}");
    }
    let p = problems(
        "[engine]\nkind = \"x\"\n",
        &[("GOODPUT_PROXY_ENGINE_KIND", "sglang")],
    );
    assert!(p.is_empty(), "{p:?}");
}

#[test]
fn clickhouse_sink_settings() {
    let c = Config::from_toml(
        "[server]\ninstance = \"p-1\"\n[sink.clickhouse]\nurl = \"http://ch:8123\"\nbatch_size = 500\n",
        "c.toml",
    )
    .unwrap();
    let ch = c.clickhouse.unwrap();
    assert_eq!((ch.batch_size, ch.queue), (500, 100_000));
    assert_eq!(ch.flush_interval, Duration::from_secs(1));
    assert_eq!(
        (ch.database.as_str(), ch.table.as_str()),
        ("goodput", "records")
    );
    assert_eq!(c.server.instance, "p-1");
    let on = Config::from_toml("[sink.clickhouse]\n", "c.toml").unwrap();
    assert!(on.clickhouse.is_some(), "an empty table turns it on");
    let raw = RawClickHouse {
        password: None,
        password_env: "GOODPUT_TEST_SURELY_UNSET_VAR".into(),
        ..Default::default()
    };
    let raw = RawConfig {
        sink: RawSink {
            clickhouse: Some(raw),
        },
        ..Default::default()
    };
    assert_eq!(raw.check().unwrap().clickhouse.unwrap().password, "");
}

#[test]
fn validation_names_the_field() {
    type Case = (&'static str, &'static str);
    let cases: &[Case] = &[
        ("[server]\ntls_cert = \"x\"", "server.tls_cert"),
        ("[server]\nmax_in_flight = 0", "server.max_in_flight"),
        ("[server]\npaths = [\"v1\"]", "server.paths"),
        ("[server]\ninstance = \"\"", "server.instance"),
        ("[upstream]\nurls = [\"ftp://x\"]", "upstream.urls"),
        ("[upstream]\ndiscover = [\"dns://x\"]", "upstream.discover"),
        (
            "[upstream]\nfirst_byte_timeout_ms = 0",
            "upstream.first_byte_timeout_ms",
        ),
        (
            "[upstream]\nhealth_path = \"health\"",
            "upstream.health_path",
        ),
        ("[measure]\nrecords = 0", "measure.records"),
        (
            "[measure]\nsink_path = \"/x\"\nsink_queue = 0",
            "measure.sink_queue",
        ),
        (
            "[engine]\nscrape_timeout_ms = 0",
            "engine.scrape_timeout_ms",
        ),
        ("[engine]\npath = \"metrics\"", "engine.path"),
        ("[slo.models.\"\"]\nttft_ms = 1", "slo.models"),
        (
            "[sink.clickhouse]\nurl = \"https://ch\"",
            "sink.clickhouse.url",
        ),
        (
            "[sink.clickhouse]\ntable = \"a;drop\"",
            "sink.clickhouse.table",
        ),
        (
            "[sink.clickhouse]\nbatch_size = 0",
            "sink.clickhouse.batch_size",
        ),
        (
            "[sink.clickhouse]\nretry_max_ms = 1",
            "sink.clickhouse.retry_max_ms",
        ),
        ("[sink.clickhouse]\nurls = []", "sink.clickhouse.urls"),
        (
            "[measure]\nusage_injection = \"on\"",
            "measure.usage_injection",
        ),
        ("[engine]\nupstream_label = \"ip\"", "engine.upstream_label"),
        ("[sim]\nmodels = []", "sim.models"),
    ];
    for (toml, field) in cases {
        let p = problems(toml, &[]);
        assert_eq!(p.len(), 1, "{toml}: {p:?}");
        assert_eq!(p[0].field, *field, "{toml}");
        assert!(
            p[0].to_string()
                .starts_with(&format!("f.toml: field `{field}`: ")),
            "{}",
            p[0]
        );
    }
}

#[test]
fn a_syntax_error_stops_at_once_with_its_line() {
    let err = Config::from_toml("[server\n", "s.toml")
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("s.toml: "), "{err}");
    assert!(err.contains("line 1"), "{err}");
}

#[test]
fn limits_and_trusted_proxies_from_file_and_env_each_bad_one_named() {
    let c = Config::load(
        None,
        env(&[
            ("GOODPUT_PROXY_LIMITS_MAX_HEAD_BYTES", "16384"),
            ("GOODPUT_PROXY_LIMITS_BODY_IDLE_TIMEOUT_MS", "1500"),
            ("GOODPUT_PROXY_SERVER_TRUSTED_PROXIES", "2"),
        ]),
        vec![],
    )
    .unwrap();
    assert_eq!(c.limits.max_head_bytes, 16384);
    assert_eq!(c.limits.body_idle_timeout, Duration::from_millis(1500));
    assert_eq!(c.limits.h2_max_concurrent_streams, 100, "the default");
    assert_eq!(c.server.trusted_proxies, 2);
    let p = problems(
        "[limits]\nmax_head_bytes = 100\nmax_connections = 0\nh2_stream_window_bytes = 10\n",
        &[],
    );
    let fields: Vec<&str> = p.iter().map(|p| p.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "limits.max_head_bytes",
            "limits.max_connections",
            "limits.h2_stream_window_bytes"
        ],
        "{p:?}"
    );
}

#[test]
fn trace_settings_are_checked_by_field_and_overridable_from_the_environment() {
    let c = Config::from_toml("", "d.toml").unwrap();
    assert_eq!(c.trace.sample_rate, 0.0, "off unless asked");
    assert_eq!(c.trace.bounds.max_tokens, 4096);
    assert_eq!(c.trace.max_traces, 64);
    for (toml, field) in [
        ("[trace]\nsample_rate = 1.5\n", "trace.sample_rate"),
        ("[trace]\nsample_rate = -0.1\n", "trace.sample_rate"),
        ("[trace]\nsample_rate = nan\n", "trace.sample_rate"),
        ("[trace]\nmax_tokens = 0\n", "trace.max_tokens"),
        ("[trace]\nmax_trace = 1\n", "trace.max_trace"),
    ] {
        let p = problems(toml, &[]);
        assert_eq!(p.len(), 1, "{toml}: {p:?}");
        assert_eq!(p[0].field, field, "{toml}");
    }
    let p = problems("", &[("GOODPUT_PROXY_TRACE_SAMPLE_RATE", "2")]);
    assert_eq!(
        (p.len(), p[0].field.as_str(), &p[0].origin),
        (
            1,
            "trace.sample_rate",
            &Origin::Env("GOODPUT_PROXY_TRACE_SAMPLE_RATE".into())
        )
    );
    let c = Config::load(
        None,
        env(&[
            ("GOODPUT_PROXY_TRACE_SAMPLE_RATE", "0.25"),
            ("GOODPUT_PROXY_TRACE_MAX_TOKENS", "10"),
            ("GOODPUT_PROXY_TRACE_MAX_TRACES", "0"),
        ]),
        vec![],
    )
    .unwrap();
    assert_eq!(
        (
            c.trace.sample_rate,
            c.trace.bounds.max_tokens,
            c.trace.max_traces
        ),
        (0.25, 10, 0)
    );
}

#[test]
fn auth_problems_each_name_their_field() {
    let good = crate::auth::hex(&crate::auth::digest_of(b"k"));
    let toml = format!(
        "[measure]\nenabled = false\n\
         [auth.tenants.none]\nkeys = [\"{good}\"]\n\
         [auth.tenants.b]\nkeys = [\"abc\"]\nmax_in_flight = 0\ntokens_per_minute = 10\n\
         [auth.tenants.c]\nkeys = []\n\
         [auth.tenants.d]\nkeys = [\"{good}\"]\n\
         [upstream]\napi_key = \"has space\"\n"
    );
    let p = problems(&toml, &[]);
    let got: Vec<(String, &str)> = p
        .iter()
        .map(|p| (p.field.clone(), p.message.as_str()))
        .collect();
    let has = |field: &str, words: &str| got.iter().any(|(f, m)| f == field && m.contains(words));
    assert!(has("auth.tenants.none", "reserved"), "{got:?}");
    assert!(has("auth.tenants.b.keys", "64 hex digits"), "{got:?}");
    assert!(has("auth.tenants.b.max_in_flight", "positive"), "{got:?}");
    assert!(
        has("auth.tenants.b.tokens_per_minute", "measure.enabled"),
        "{got:?}"
    );
    assert!(has("auth.tenants.c.keys", "needs a key"), "{got:?}");
    assert!(has("auth.tenants", "listed for `d` too"), "{got:?}");
    assert!(has("upstream.api_key", "not shown"), "{got:?}");
    assert_eq!(got.len(), 7, "{got:?}");
    assert!(
        p.iter().all(|p| !p.message.contains("has space")),
        "the key is echoed"
    );
}

#[test]
fn auth_is_off_by_default_and_the_keys_file_comes_from_the_environment() {
    assert!(!Config::default().auth.enabled());
    let dir = std::env::temp_dir().join(format!("goodput-auth-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("keys.toml");
    let digest = crate::auth::hex(&crate::auth::digest_of(b"k"));
    std::fs::write(&file, format!("[tenants.f]\nkeys = [\"{digest}\"]\n")).unwrap();
    let var = file.display().to_string();
    let c = Config::load(
        None,
        env(&[("GOODPUT_PROXY_AUTH_KEYS_FILE", &var)]),
        Vec::new(),
    )
    .unwrap();
    assert!(c.auth.enabled());
    assert_eq!(c.auth.file_tenants.len(), 1);
    assert_eq!(c.auth.file_tenants[0].name, "f");
    std::fs::write(&file, "[tenants.f]\nkeys = [\"nope\"]\n").unwrap();
    let e = Config::load(
        None,
        env(&[("GOODPUT_PROXY_AUTH_KEYS_FILE", &var)]),
        Vec::new(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("field `auth.keys_file`") && e.contains("tenants.f.keys[0]"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn upstream_tls_problems_name_their_field() {
    let p = problems(
        "[upstream]\nurls = [\"https://e:1\"]\ntls_client_cert = \"c.pem\"\n",
        &[],
    );
    let fields: Vec<&str> = p.iter().map(|p| p.field.as_str()).collect();
    assert_eq!(
        fields,
        ["upstream.tls_client_cert", "upstream.tls_ca"],
        "{p:?}"
    );
    let c = Config::from_toml(
        "[upstream]\nurls = [\"https://e:1\"]\ntls_ca = \"ca.pem\"\n",
        "f.toml",
    )
    .unwrap();
    let tls = c.upstream.tls.unwrap();
    assert_eq!(tls.ca, Path::new("ca.pem"));
    assert_eq!(tls.client, None);
}

#[test]
fn an_open_admin_port_beyond_loopback_is_warned_about() {
    let token = AdminConfig {
        token: Some(crate::auth::digest_of(b"t")),
        ..AdminConfig::default()
    };
    let none = AdminConfig::default();
    let addr = |s: &str| s.parse::<SocketAddr>().unwrap();
    // (listen, token set, warned)
    for (listen, with_token, warned) in [
        ("127.0.0.1:9090", false, false),
        ("[::1]:9090", false, false),
        ("0.0.0.0:9090", false, true),
        ("10.1.2.3:9090", false, true),
        ("0.0.0.0:9090", true, false),
    ] {
        let c = if with_token { &token } else { &none };
        let w = c.exposure_warning(addr(listen));
        assert_eq!(w.is_some(), warned, "{listen} {with_token}: {w:?}");
    }
    let bad = Config::load(
        None,
        [(
            "GOODPUT_PROXY_ADMIN_TOKEN_SHA256".to_string(),
            "hunter2".to_string(),
        )],
        Vec::new(),
    )
    .unwrap_err();
    assert!(
        bad.problems()
            .iter()
            .any(|p| p.to_string().contains("admin.token_sha256")),
        "{:?}",
        bad.problems()
    );
}
