//! The benchmark on top of the lab (`longhaul-lab`): suites as data files
//! ([`scenario`], `suites/*.toml`), one adapter per peer tool ([`tools`]),
//! data sets ([`dataset`]), the runner ([`runner`]), what a run produced
//! ([`results`]) and the reports made from it ([`report`], [`html`]).
//!
//! Modules depend one way: `runner` → `tools`, `dataset`, `scenario`,
//! `results`; `report` → `html` → `results` → `scenario`.

pub mod dataset;
pub mod html;
pub mod report;
pub mod results;
pub mod runner;
pub mod scenario;
pub mod tools;
