//! D-Bus API calls by interface, method and result
//! (`drover_dbus_calls_total`), counted as each call ends
//! (`crate::api::counted` does the counting).
//!
//! Labels are bounded whatever a client sends:
//! * `interface`: one of the served interfaces ([`DbusCalls::interface`] is
//!   called once per interface type the manager serves);
//! * `method`: one of the interface's own methods, read from its
//!   introspection when it is first served; a call of any other name
//!   counts as [`UNKNOWN_METHOD`], never under the name it asked for;
//! * `result`: `ok`, or the class of the error answered, one of
//!   [`RESULTS`] (an error name drover does not know counts as `other`).
//!
//! Invariant: counting is an atomic add on a table fixed when the interface
//! is first served; a scrape takes one short lock (the list of served
//! interfaces, a handful) and never one the API's calls take.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The `method` label of a call of a method the interface does not have.
pub const UNKNOWN_METHOD: &str = "unknown";

/// Every `result` label: `ok`, the error classes drover answers, `other`.
/// An error class is the last part of its D-Bus error name.
pub const RESULTS: [&str; 18] = [
    "ok",
    "Failed",
    "InvalidArgs",
    "NotSupported",
    "UnknownMethod",
    "UnknownObject",
    "AccessDenied",
    "LimitsExceeded",
    "ServiceUnknown",
    "NoReply",
    "Disconnected",
    "FileNotFound",
    "NoSuchUnit",
    "NoSuchJob",
    "Offline",
    "ActivationFailed",
    "NotLeader",
    "other",
];

/// The error names each class of [`RESULTS`] stands for (index in RESULTS).
const CLASSES: [(&str, usize); 16] = {
    use drover_protocol::error_names::*;
    [
        (FAILED, 1),
        (INVALID_ARGS, 2),
        (NOT_SUPPORTED, 3),
        (UNKNOWN_METHOD, 4),
        (UNKNOWN_OBJECT, 5),
        (ACCESS_DENIED, 6),
        (LIMITS_EXCEEDED, 7),
        (SERVICE_UNKNOWN, 8),
        (NO_REPLY, 9),
        (DISCONNECTED, 10),
        (FILE_NOT_FOUND, 11),
        (NO_SUCH_UNIT, 12),
        (NO_SUCH_JOB, 13),
        (OFFLINE, 14),
        (ACTIVATION_FAILED, 15),
        (NOT_LEADER, 16),
    ]
};

/// The index in [`RESULTS`] of an answer: `None` is `ok`, an error name its
/// class, any other name `other`.
pub fn result_index(error: Option<&str>) -> usize {
    match error {
        None => 0,
        Some(name) => CLASSES
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(RESULTS.len() - 1, |(_, i)| *i),
    }
}

type Row = [AtomicU64; RESULTS.len()];

/// One interface's table: a row per method, one more for unknown names.
#[derive(Debug)]
pub struct InterfaceCalls {
    interface: String,
    /// Each method's name and the signature of its arguments.
    methods: Vec<(String, String)>,
    rows: Vec<Row>,
    unknown: Row,
}

impl InterfaceCalls {
    /// The row of `method`, if the interface has it, and the signature its
    /// arguments must have.
    pub fn method(&self, method: &str) -> Option<(usize, &str)> {
        self.methods
            .iter()
            .position(|(m, _)| m == method)
            .map(|i| (i, self.methods[i].1.as_str()))
    }

    /// A call of method `row` (`None`: unknown) ended with `result` (an
    /// index in [`RESULTS`]).
    pub fn count(&self, row: Option<usize>, result: usize) {
        let row = row.and_then(|r| self.rows.get(r)).unwrap_or(&self.unknown);
        if let Some(c) = row.get(result) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn name(&self) -> &str {
        &self.interface
    }
}

/// Every served interface's table (see the module docs).
#[derive(Debug, Default, Clone)]
pub struct DbusCalls {
    interfaces: Arc<Mutex<Vec<Arc<InterfaceCalls>>>>,
}

impl DbusCalls {
    /// The table of `interface`, made on first use from its introspection
    /// XML (`introspect`, called only then).
    pub fn interface(
        &self,
        interface: &str,
        introspect: impl FnOnce() -> String,
    ) -> Arc<InterfaceCalls> {
        let mut all = self.interfaces.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = all.iter().find(|t| t.interface == interface) {
            return t.clone();
        }
        let methods = methods_of(&introspect());
        let table = Arc::new(InterfaceCalls {
            interface: interface.to_owned(),
            rows: methods.iter().map(|_| Row::default()).collect(),
            methods,
            unknown: Row::default(),
        });
        all.push(table.clone());
        table
    }

    fn snapshot(&self) -> Vec<Arc<InterfaceCalls>> {
        self.interfaces
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// The methods of one interface's introspection XML, as zbus writes it:
/// each `<method name="M">` with the types of its `direction="in"` args,
/// in order (an arg without a direction is an input, as D-Bus says).
pub fn methods_of(xml: &str) -> Vec<(String, String)> {
    let attr = |tag: &str, name: &str| -> Option<String> {
        let start = tag.find(&format!("{name}=\""))? + name.len() + 2;
        let len = tag[start..].find('"')?;
        Some(tag[start..start + len].to_owned())
    };
    let mut methods: Vec<(String, String)> = Vec::new();
    let mut open = false;
    for tag in xml.split('<').map(str::trim) {
        if tag.starts_with("method ") {
            if let Some(name) = attr(tag, "name") {
                methods.push((name, String::new()));
                open = !tag.ends_with("/>");
            }
        } else if tag.starts_with("/method") {
            open = false;
        } else if open && tag.starts_with("arg ") {
            let input = attr(tag, "direction").is_none_or(|d| d == "in");
            if let (true, Some(t), Some(m)) = (input, attr(tag, "type"), methods.last_mut()) {
                m.1.push_str(&t);
            }
        }
    }
    methods
}

impl Collector for DbusCalls {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let tables = self.snapshot();
        let mut family = encoder.encode_descriptor(
            "drover_dbus_calls",
            "D-Bus API calls by interface, method (unknown: a name the interface does not have) and result (ok, or the class of the error answered)",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for t in &tables {
            let rows = t
                .methods
                .iter()
                .map(|(m, _)| m.as_str())
                .zip(&t.rows)
                .chain(std::iter::once((UNKNOWN_METHOD, &t.unknown)));
            for (method, row) in rows {
                for (i, (result, n)) in RESULTS.iter().zip(row).enumerate() {
                    let n = n.load(Ordering::Relaxed);
                    // Every known method shows `ok`; the rest once they happened.
                    if n == 0 && (i != 0 || method == UNKNOWN_METHOD) {
                        continue;
                    }
                    ConstCounter::new(n).encode(family.encode_family(&vec![
                        ("interface", t.interface.as_str()),
                        ("method", method),
                        ("result", *result),
                    ])?)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const XML: &str = r#"<interface name="org.example.I">
  <method name="ListNodes">
    <arg name="nodes" type="a(soss)" direction="out"/>
  </method>
  <method name="StartUnit">
    <arg name="name" type="s" direction="in"/>
    <arg name="mode" type="s" direction="in"/>
    <arg name="job" type="o" direction="out"/>
  </method>
  <method name="Ping"/>
  <signal name="JobNew">
    <arg name="id" type="u"/>
  </signal>
  <property name="Status" type="s" access="read"/>
</interface>
"#;

    #[test]
    fn methods_and_their_inputs_come_from_the_introspection() {
        assert_eq!(
            methods_of(XML),
            [
                ("ListNodes".to_owned(), String::new()),
                ("StartUnit".to_owned(), "ss".to_owned()),
                ("Ping".to_owned(), String::new()),
            ]
        );
        assert!(methods_of("").is_empty());
        assert!(methods_of("<<<method name=\"x").is_empty());
    }

    #[test]
    fn results_are_bounded() {
        assert_eq!(RESULTS[result_index(None)], "ok");
        assert_eq!(
            RESULTS[result_index(Some("org.eclipse.bluechi.Offline"))],
            "Offline"
        );
        assert_eq!(
            RESULTS[result_index(Some("org.freedesktop.DBus.Error.InvalidArgs"))],
            "InvalidArgs"
        );
        for other in ["", "x.y.Offline", "org.example.Mine", &"a".repeat(4096)] {
            assert_eq!(RESULTS[result_index(Some(other))], "other", "{other}");
        }
        for (name, i) in CLASSES {
            assert!(name.ends_with(&format!(".{}", RESULTS[i])), "{name}");
        }
    }

    #[test]
    fn calls_show_under_known_names_only() {
        let calls = DbusCalls::default();
        let t = calls.interface("org.example.I", || XML.to_owned());
        let again = calls.interface("org.example.I", || panic!("made once"));
        assert!(Arc::ptr_eq(&t, &again));
        let (start, sig) = t.method("StartUnit").unwrap();
        assert_eq!(sig, "ss");
        t.count(Some(start), 0);
        t.count(
            Some(start),
            result_index(Some("org.eclipse.bluechi.Offline")),
        );
        t.count(t.method("Evil\"}\n").map(|m| m.0), 4);
        t.count(Some(99), 0);
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(calls.clone()));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let line = |l: &str| text.lines().any(|x| x == l);
        assert!(
            line(
                r#"drover_dbus_calls_total{interface="org.example.I",method="StartUnit",result="ok"} 1"#
            ),
            "{text}"
        );
        assert!(
            line(
                r#"drover_dbus_calls_total{interface="org.example.I",method="StartUnit",result="Offline"} 1"#
            ),
            "{text}"
        );
        assert!(
            line(
                r#"drover_dbus_calls_total{interface="org.example.I",method="Ping",result="ok"} 0"#
            ),
            "{text}"
        );
        assert!(
            line(
                r#"drover_dbus_calls_total{interface="org.example.I",method="unknown",result="UnknownMethod"} 1"#
            ),
            "{text}"
        );
        assert!(
            line(
                r#"drover_dbus_calls_total{interface="org.example.I",method="unknown",result="ok"} 1"#
            ),
            "{text}"
        );
        assert!(!text.contains("Evil"), "{text}");
        assert!(
            !text.contains("JobNew") && !text.contains("Status"),
            "{text}"
        );
    }
}
