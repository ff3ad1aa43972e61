//! `org.eclipse.bluechi.Metrics` at `/org/eclipse/bluechi/metrics`, served
//! only while metrics are enabled (`Controller.EnableMetrics`). The state and
//! the rules live in [`crate::metrics`]; this object only declares the
//! signals, which [`crate::api::outbound::BusOutbound`] emits.

use zbus::interface;
use zbus::object_server::SignalEmitter;

pub struct MetricsObject;

#[interface(name = "org.eclipse.bluechi.Metrics", introspection_docs = false)]
impl MetricsObject {
    #[zbus(signal)]
    async fn start_unit_job_metrics(
        emitter: &SignalEmitter<'_>,
        node_name: &str,
        job_id: &str,
        unit: &str,
        job_measured_time_micros: u64,
        unit_start_prop_time_micros: u64,
    ) -> zbus::Result<()>;

    #[zbus(signal)]
    async fn agent_job_metrics(
        emitter: &SignalEmitter<'_>,
        node_name: &str,
        unit: &str,
        method: &str,
        systemd_job_time_micros: u64,
    ) -> zbus::Result<()>;
}
