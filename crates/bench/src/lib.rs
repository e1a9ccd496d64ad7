//! The benchmark on top of the lab (`longhaul-lab`): suites as data files
//! ([`scenario`], `suites/*.toml`), one adapter per peer tool ([`tools`]),
//! data sets (`dataset`), the runner ([`runner`]), what a run produced
//! ([`results`]) and the reports made from it ([`report`], `html`), and
//! README-sized tables of it ([`numbers`], `longhaul lab table`), and two
//! builds' runs side by side ([`compare`], `longhaul lab compare`).
//!
//! The runner's helpers have modules of their own: `proc` (processes in
//! the hosts), `host` (host settings), `live` (what an interrupted run
//! must undo), `stage` (the run's directories where every tool can reach
//! them), `metrics` (numbers from what was measured).
//!
//! Modules depend one way: `runner` → `feed`, `proc`, `host`, `metrics`,
//! `tools`, `dataset`, `scenario`, `results`; `runner`, `proc`, `host` →
//! `live` → `stage` (whose `mount` and `unmount` every mount of a run goes
//! through, `host`'s tmpfs too); `report` → `html`; `numbers` → `compare`
//! (its medians) → `results`, `scenario`; `report`, `html`, `numbers` →
//! `text` (the words and numbers both print) → `results` → `scenario` →
//! `tools`.

#![warn(missing_docs, unreachable_pub)]

pub mod compare;
mod dataset;
mod feed;
mod host;
mod html;
mod live;
mod metrics;
pub mod numbers;
mod proc;
pub mod report;
pub mod results;
pub mod runner;
pub mod scenario;
mod stage;
mod text;
pub mod tools;
