//! Cross-node dependencies, manager side: the reference sets and their rules
//! as plain data ([`rules`]), and the async glue that carries out what they
//! decide ([`driver`]).

pub mod driver;
pub mod rules;
