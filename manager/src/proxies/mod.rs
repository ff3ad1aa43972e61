//! Cross-node dependencies, manager side: the reference sets and their rules
//! as plain data ([`rules`]), the async glue that carries out what they
//! decide ([`driver`]), and what they count for the metrics ([`stats`]).

pub mod driver;
pub mod rules;
pub mod stats;
