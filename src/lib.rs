//! goodput-proxy: a reverse proxy for vLLM and OpenAI-compatible engines that measures
//! what clients really get. See `DESIGN.md` for the definitions this crate implements.

pub mod admin;
pub mod app;
pub mod auth;
pub mod body;
pub mod cli;
pub mod compare;
pub mod config;
pub mod context;
pub mod dashboard;
pub mod discover;
pub mod engine;
pub mod error;
pub mod layer;
pub mod limits;
pub mod listener;
pub mod logging;
pub mod metrics;
pub mod recorder;
pub mod reload;
pub mod report;
pub mod scale;
pub mod sink;
pub mod stack;
pub mod state;
pub mod upstream;
