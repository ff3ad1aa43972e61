//! The `NODE_UNIT` instance name the helper is run with, and its validation.
//!
//! The rule is shared with the agent (which recognises proxy units by it), so
//! it lives in [`drover_protocol::proxy_instance`]; the helper uses it from
//! there.

pub use drover_protocol::proxy_instance::{InstanceError, ProxyInstance};
