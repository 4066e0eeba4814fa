//! Pure measurement core: chunk inspection, timelines, outcomes, SLOs and goodput.
