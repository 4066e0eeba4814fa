//! goodput-loadtest: phased load with exact client-side percentiles (issue 5).
#![forbid(unsafe_code)]

fn main() {
    eprintln!("goodput-loadtest: not built yet");
    std::process::exit(2);
}
