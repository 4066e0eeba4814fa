use super::*;

#[test]
fn queries() {
    let s = Duration::from_secs;
    let cases: [(Option<&str>, Result<Duration, QueryError>); 7] = [
        (None, Ok(DEFAULT_WINDOW)),
        (Some(""), Ok(DEFAULT_WINDOW)),
        (Some("window=30"), Ok(s(30))),
        (Some("window=600"), Ok(MAX_WINDOW)),
        (Some("window=0.5"), Err(QueryError::BadWindow("0.5".into()))),
        (Some("window=601"), Err(QueryError::BadWindow("601".into()))),
        (
            Some("model=x"),
            Err(QueryError::UnknownParam("model".into())),
        ),
    ];
    for (q, want) in cases {
        assert_eq!(parse_query(q), want, "{q:?}");
    }
    assert_eq!(QueryError::BadWindow("x".into()).param(), "window");
}

/// The names between `open` and the next `"` after each occurrence.
fn names_after<'a>(text: &'a str, open: &str) -> Vec<&'a str> {
    text.split(open)
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .collect()
}

/// Each panel is three things with one name: a section of the page, a renderer in its script
/// and a builder of the document. A panel missing one of them shows "no data" in the page.
#[test]
fn every_panel_has_a_section_a_renderer_and_a_builder() {
    let sections = names_after(PAGE, "data-panel=\"");
    let builders: Vec<&str> = panels::PANELS.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        sections, builders,
        "sections in the page, in the document's order"
    );
    for name in &builders {
        assert!(
            PAGE.contains(&format!("PANELS.{name} = ")),
            "no renderer PANELS.{name} in page/dashboard.js"
        );
    }
}

/// Self-contained: the page loads nothing from anywhere (no src= or href= to another origin,
/// no import), and the chart library's license travels with it.
#[test]
fn the_page_is_self_contained() {
    for attr in ["src=\"", "href=\"", "@import", "url(http"] {
        for target in names_after(PAGE, attr) {
            assert!(
                !target.contains("//"),
                "{attr}{target}: the page must not load anything"
            );
        }
    }
    assert!(
        PAGE.contains("Permission is hereby granted"),
        "uPlot's MIT license"
    );
    assert!(PAGE.len() < 128 << 10, "the page is {} bytes", PAGE.len());
}
