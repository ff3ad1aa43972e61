//! drover's build tasks, behind `make man`, `make install`, `make deb` and the
//! shipping tests (`xtask/tests/`).
//!
//! * [`man`]: the Markdown man pages of `docs/man/` rendered to roff;
//! * [`completions`]: droverctl's bash, zsh and fish completions, from its clap
//!   definition;
//! * [`packages`]: what is installed where and in which package, install trees
//!   (`make install`);
//! * [`deb`]: `.deb` files of those packages (`make deb`).

pub mod completions;
pub mod deb;
pub mod man;
pub mod packages;
