//! goodput-proxy: a reverse proxy for vLLM and OpenAI-compatible engines that measures
//! what clients really get. See `DESIGN.md` for the definitions this crate implements.
#![forbid(unsafe_code)]

pub mod body;
pub mod measure;
pub mod sim;
