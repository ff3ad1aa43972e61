//! `metrics enable|disable|listen`.
//!
//! enable/disable call `Controller.EnableMetrics` / `DisableMetrics` and print
//! `Done` (bluechictl). listen prints `Waiting for metrics signals...` and then one
//! entry per signal of `/org/eclipse/bluechi/metrics` until Ctrl-C:
//!
//! ```text
//! [node1] Job /org/eclipse/bluechi/job/4 to start unit web.service:
//!         BlueChi job gross measured time: 12.3ms
//!         Unit net start time (from properties): 4.0ms
//! [node1] Agent systemd StartUnit job on web.service net measured time: 3.1ms
//! ```
//!
//! With `--json`, JSON Lines (`{"event": "StartUnitJobMetrics", ...}`). Exit 1 when
//! drover-manager leaves the bus.

use serde_json::{Value as Json, json};

use crate::client::CallContext;
use crate::context::{Context, Run};
use crate::error::CtlError;
use crate::follow::{self, ManagerWatch};
use crate::output;
use drover_bus::bluechi::{METRICS_IFACE, METRICS_PATH};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MetricsAction {
    /// Make the manager and agents measure jobs
    Enable,
    /// Stop measuring
    Disable,
    /// Print metrics signals until Ctrl-C
    Listen,
}

#[derive(Debug, clap::Args)]
pub struct Metrics {
    #[arg(value_enum, value_name = "enable|disable|listen")]
    pub action: MetricsAction,
}

/// One metrics signal.
#[derive(Debug, Clone, PartialEq)]
pub enum MetricsEvent {
    StartUnitJob {
        node: String,
        job: String,
        unit: String,
        job_us: u64,
        unit_start_us: u64,
    },
    AgentJob {
        node: String,
        unit: String,
        method: String,
        systemd_job_us: u64,
    },
}

fn ms(us: u64) -> String {
    // Precision loss above 2^53 µs (285 years) does not matter for a duration.
    format!("{:.1}ms", us as f64 / 1000.0)
}

impl MetricsEvent {
    pub fn from_message(msg: &zbus::Message) -> Option<MetricsEvent> {
        let body = msg.body();
        match follow::member(msg).as_str() {
            "StartUnitJobMetrics" => {
                let (node, job, unit, job_us, unit_start_us): (String, String, String, u64, u64) =
                    body.deserialize().ok()?;
                Some(MetricsEvent::StartUnitJob {
                    node,
                    job,
                    unit,
                    job_us,
                    unit_start_us,
                })
            }
            "AgentJobMetrics" => {
                let (node, unit, method, systemd_job_us): (String, String, String, u64) =
                    body.deserialize().ok()?;
                Some(MetricsEvent::AgentJob {
                    node,
                    unit,
                    method,
                    systemd_job_us,
                })
            }
            _ => None,
        }
    }

    /// bluechictl's text.
    pub fn text(&self) -> String {
        match self {
            MetricsEvent::StartUnitJob {
                node,
                job,
                unit,
                job_us,
                unit_start_us,
            } => format!(
                "[{node}] Job {job} to start unit {unit}:\n\tBlueChi job gross measured time: {}\n\tUnit net start time (from properties): {}\n",
                ms(*job_us),
                ms(*unit_start_us)
            ),
            MetricsEvent::AgentJob {
                node,
                unit,
                method,
                systemd_job_us,
            } => format!(
                "[{node}] Agent systemd {method} job on {unit} net measured time: {}\n",
                ms(*systemd_job_us)
            ),
        }
    }

    /// The JSON Lines form. Keys are a stable interface.
    pub fn json(&self) -> Json {
        match self {
            MetricsEvent::StartUnitJob {
                node,
                job,
                unit,
                job_us,
                unit_start_us,
            } => json!({"event": "StartUnitJobMetrics", "node": node, "job": job, "unit": unit,
                        "job_measured_time_us": job_us, "unit_start_time_us": unit_start_us}),
            MetricsEvent::AgentJob {
                node,
                unit,
                method,
                systemd_job_us,
            } => json!({"event": "AgentJobMetrics", "node": node, "unit": unit,
                        "method": method, "systemd_job_time_us": systemd_job_us}),
        }
    }
}

impl Run for Metrics {
    async fn run(self, ctx: &mut Context) -> Result<(), CtlError> {
        let client = ctx.client().await?.clone();
        match self.action {
            MetricsAction::Enable | MetricsAction::Disable => {
                let controller = client.controller().await?;
                let (method, r) = if self.action == MetricsAction::Enable {
                    ("EnableMetrics", controller.enable_metrics().await)
                } else {
                    ("DisableMetrics", controller.disable_metrics().await)
                };
                let cc = CallContext {
                    what: method,
                    ..Default::default()
                };
                client.check(r, cc).await?;
                let text = if ctx.json() {
                    output::json(&[json!({"operation": method, "result": "done"})])
                } else {
                    "Done\n".to_owned()
                };
                ctx.emit(&text)
            }
            MetricsAction::Listen => {
                let mut manager = ManagerWatch::new(&client, "listening for metrics").await?;
                let mut events =
                    follow::signal_stream(&client, &manager, METRICS_PATH, false, METRICS_IFACE)
                        .await?;
                if !ctx.json() {
                    ctx.emit("Waiting for metrics signals...\n")?;
                }
                let interrupted = follow::interrupted();
                tokio::pin!(interrupted);
                loop {
                    tokio::select! {
                        biased;
                        msg = follow::next_signal(&mut events, &client) => {
                            if let Some(ev) = MetricsEvent::from_message(&msg?) {
                                let text = if ctx.json() {
                                    output::json_line(&ev.json())
                                } else {
                                    ev.text()
                                };
                                ctx.emit(&text)?;
                            }
                        }
                        gone = manager.gone() => return Err(gone),
                        r = &mut interrupted => return r,
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_are_bluechictls() {
        let ev = MetricsEvent::StartUnitJob {
            node: "n1".into(),
            job: "/org/eclipse/bluechi/job/4".into(),
            unit: "a.service".into(),
            job_us: 12_345,
            unit_start_us: 4_000,
        };
        assert_eq!(
            ev.text(),
            "[n1] Job /org/eclipse/bluechi/job/4 to start unit a.service:\n\tBlueChi job gross measured time: 12.3ms\n\tUnit net start time (from properties): 4.0ms\n"
        );
        let ev = MetricsEvent::AgentJob {
            node: "n1".into(),
            unit: "a.service".into(),
            method: "StartUnit".into(),
            systemd_job_us: 3_149,
        };
        assert_eq!(
            ev.text(),
            "[n1] Agent systemd StartUnit job on a.service net measured time: 3.1ms\n"
        );
        assert_eq!(ev.json()["systemd_job_time_us"], 3149);
    }
}
