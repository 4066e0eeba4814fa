#![forbid(unsafe_code)]

fn main() {
    eprintln!("goodput-proxy: skeleton");
}
