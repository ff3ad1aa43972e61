//! `io.drover.Controller` at `/org/eclipse/bluechi`: drover's additions to the
//! controller object, on an interface of their own so BlueChi's
//! `org.eclipse.bluechi.Controller` stays exactly as BlueChi defines it.

use crate::proxies::driver::{Proxies, ProxyTuple};
use zbus::interface;

pub struct DroverControllerObject {
    proxies: Proxies,
}

impl DroverControllerObject {
    pub fn new(proxies: Proxies) -> Self {
        Self { proxies }
    }
}

#[interface(name = "io.drover.Controller", introspection_docs = false)]
impl DroverControllerObject {
    /// Every cross-node dependency the manager tracks, ordered by target
    /// (node, unit) then requesting node: (requesting node, target node,
    /// unit, proxy state `waiting`/`active`/`failed`, target active state as
    /// last known or `unknown`, number of live references on the target).
    #[zbus(out_args("proxies"))]
    async fn list_proxies(&self) -> Vec<ProxyTuple> {
        self.proxies.list().await
    }
}
