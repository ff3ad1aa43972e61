//! etcd's v3 JSON gateway, as far as the election uses it: the request
//! bodies and the answers, with keys and values in base64 and 64-bit
//! numbers as JSON strings (grpc-gateway's encoding; plain numbers are
//! accepted too). Fields at their default value are left out by etcd
//! (`"succeeded": false`, a `PUT` event's `type`, a lost lease's `TTL`), so
//! every field here has a default.
//!
//! Pure: no I/O. Whatever etcd (or whatever answers on its port) sends is
//! parsed into these types or refused with [`WireError`]; nothing panics.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde::{Deserialize, Deserializer};
use serde_json::{Value, json};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("etcd answered with an error: {0}")]
    Etcd(String),
    #[error("etcd's answer is not what the gateway sends: {0}")]
    Garbage(String),
}

/// A 64-bit number as etcd's gateway writes it: `"12"` or `12`.
fn num<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum N {
        S(String),
        I(i64),
    }
    match N::deserialize(d)? {
        N::I(i) => Ok(i),
        N::S(s) => s.parse().map_err(serde::de::Error::custom),
    }
}

fn b64<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    let s = String::deserialize(d)?;
    B64.decode(s).map_err(serde::de::Error::custom)
}

pub fn encode(bytes: &[u8]) -> String {
    B64.encode(bytes)
}

#[derive(Debug, Default, Deserialize, PartialEq, Eq)]
pub struct Header {
    #[serde(default, deserialize_with = "num")]
    pub revision: i64,
}

#[derive(Debug, Default, Deserialize, PartialEq, Eq)]
pub struct KeyValue {
    #[serde(default, deserialize_with = "b64")]
    pub key: Vec<u8>,
    #[serde(default, deserialize_with = "b64")]
    pub value: Vec<u8>,
    #[serde(default, deserialize_with = "num")]
    pub create_revision: i64,
    #[serde(default, deserialize_with = "num")]
    pub mod_revision: i64,
    #[serde(default, deserialize_with = "num")]
    pub lease: i64,
}

/// `/v3/lease/grant`, and the `result` of `/v3/lease/keepalive`.
#[derive(Debug, Default, Deserialize, PartialEq, Eq)]
pub struct Lease {
    #[serde(default, rename = "ID", deserialize_with = "num")]
    pub id: i64,
    /// Seconds left; 0 (left out) when etcd does not know the lease.
    #[serde(default, rename = "TTL", deserialize_with = "num")]
    pub ttl: i64,
}

#[derive(Debug, Default, Deserialize)]
struct RangeResponse {
    #[serde(default)]
    kvs: Vec<KeyValue>,
}

#[derive(Debug, Default, Deserialize)]
struct ResponseOp {
    #[serde(default)]
    response_range: Option<RangeResponse>,
}

#[derive(Debug, Default, Deserialize)]
struct TxnResponse {
    #[serde(default)]
    header: Header,
    #[serde(default)]
    succeeded: bool,
    #[serde(default)]
    responses: Vec<ResponseOp>,
}

/// The outcome of a campaign's transaction.
#[derive(Debug, PartialEq, Eq)]
pub enum Campaign {
    /// The key was absent and is ours now; its creation revision (= the
    /// transaction's revision) is the epoch.
    Won { epoch: i64 },
    /// Another holds the key (`None`: it went between compare and read,
    /// which one transaction cannot show; the watch settles it).
    Held {
        holder: Option<KeyValue>,
        revision: i64,
    },
}

/// `/v3/kv/txn`: put `key` = `value` with `lease` if the key does not
/// exist; otherwise read it.
pub fn campaign_body(key: &[u8], value: &[u8], lease: i64) -> Value {
    let k = encode(key);
    json!({
        "compare": [{"key": k, "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
        "success": [{"request_put": {"key": k, "value": encode(value), "lease": lease.to_string()}}],
        "failure": [{"request_range": {"key": k}}],
    })
}

pub fn parse_campaign(v: Value) -> Result<Campaign, WireError> {
    let r: TxnResponse = parse(v)?;
    if r.header.revision <= 0 {
        return Err(WireError::Garbage(
            "a transaction without a revision".into(),
        ));
    }
    if r.succeeded {
        return Ok(Campaign::Won {
            epoch: r.header.revision,
        });
    }
    let holder = r
        .responses
        .into_iter()
        .next()
        .and_then(|op| op.response_range)
        .and_then(|range| range.kvs.into_iter().next());
    Ok(Campaign::Held {
        holder,
        revision: r.header.revision,
    })
}

/// `/v3/kv/range` of one key.
pub fn range_body(key: &[u8]) -> Value {
    json!({ "key": encode(key) })
}

/// A range's answer: the key (`None`: absent) and the store's revision.
pub fn parse_range(v: Value) -> Result<(Option<KeyValue>, i64), WireError> {
    let r: RangeAnswer = parse(v)?;
    if r.header.revision <= 0 {
        return Err(WireError::Garbage("a range without a revision".into()));
    }
    Ok((r.kvs.into_iter().next(), r.header.revision))
}

#[derive(Debug, Default, Deserialize)]
struct RangeAnswer {
    #[serde(default)]
    header: Header,
    #[serde(default)]
    kvs: Vec<KeyValue>,
}

/// `/v3/lease/timetolive`'s answer.
#[derive(Debug, Default, Deserialize)]
struct TimeToLive {
    /// Seconds left; -1 when etcd does not know the lease.
    #[serde(default, rename = "TTL", deserialize_with = "num")]
    ttl: i64,
    #[serde(default, rename = "grantedTTL", deserialize_with = "num")]
    granted: i64,
}

/// Whether a lease lives: `Some(granted TTL in seconds)` while it does
/// (at least 1, at most [`MAX_GRANTED_S`]), `None` once etcd no longer
/// knows it (expired or revoked).
pub fn parse_time_to_live(v: Value) -> Result<Option<u64>, WireError> {
    let t: TimeToLive = parse(v)?;
    if t.ttl < 0 {
        return Ok(None);
    }
    Ok(Some(
        t.granted.max(t.ttl).clamp(1, MAX_GRANTED_S).unsigned_abs(),
    ))
}

/// The longest lease TTL a manager trusts from etcd's answer (the config's
/// largest `EtcdLeaseTTL`): a hostile answer cannot make it wait longer.
pub const MAX_GRANTED_S: i64 = 3600;

pub fn grant_body(ttl_s: u64) -> Value {
    json!({ "TTL": ttl_s.to_string() })
}

pub fn lease_body(id: i64) -> Value {
    json!({ "ID": id.to_string() })
}

pub fn parse_grant(v: Value) -> Result<Lease, WireError> {
    let lease: Lease = parse(v)?;
    if lease.id == 0 || lease.ttl <= 0 {
        return Err(WireError::Garbage("a lease without an ID or a TTL".into()));
    }
    Ok(lease)
}

/// A keepalive's answer: the lease's TTL from now, 0 when etcd no longer
/// knows it (expired or revoked).
pub fn parse_keepalive(v: Value) -> Result<i64, WireError> {
    let result = take_result(v)?;
    let lease: Lease = parse(result)?;
    Ok(lease.ttl.max(0))
}

/// `/v3/watch`: watch `key` from `start_revision`.
pub fn watch_body(key: &[u8], start_revision: i64) -> Value {
    json!({"create_request": {"key": encode(key), "start_revision": start_revision.to_string()}})
}

#[derive(Debug, Default, Deserialize)]
struct Event {
    #[serde(default, rename = "type")]
    kind: String,
}

#[derive(Debug, Default, Deserialize)]
struct WatchResponse {
    #[serde(default)]
    events: Vec<Event>,
    #[serde(default)]
    canceled: bool,
    #[serde(default)]
    cancel_reason: String,
    #[serde(default, deserialize_with = "num")]
    compact_revision: i64,
}

/// What one message of a watch stream says about the leader key.
#[derive(Debug, PartialEq, Eq)]
pub enum Watched {
    /// Nothing that matters (the `created` message, a put).
    Nothing,
    /// The key was deleted: campaign.
    Deleted,
    /// etcd ended the watch (compaction, cancel): read the key again.
    Ended(String),
}

pub fn parse_watch(v: Value) -> Result<Watched, WireError> {
    let r: WatchResponse = parse(take_result(v)?)?;
    if r.canceled || r.compact_revision != 0 {
        return Ok(Watched::Ended(if r.cancel_reason.is_empty() {
            format!("compacted at {}", r.compact_revision)
        } else {
            r.cancel_reason
        }));
    }
    if r.events.iter().any(|e| e.kind == "DELETE") {
        return Ok(Watched::Deleted);
    }
    Ok(Watched::Nothing)
}

/// A streaming endpoint's message is `{"result": …}` or `{"error": …}`.
fn take_result(v: Value) -> Result<Value, WireError> {
    match v {
        Value::Object(mut map) => match map.remove("result") {
            Some(r) => Ok(r),
            None => Err(error_of(&Value::Object(map))),
        },
        other => Err(error_of(&other)),
    }
}

fn error_of(v: &Value) -> WireError {
    match v.get("error").or_else(|| v.get("message")) {
        Some(Value::String(s)) => WireError::Etcd(shorten(s)),
        Some(Value::Object(o)) => WireError::Etcd(shorten(
            o.get("message")
                .and_then(Value::as_str)
                .unwrap_or("(no message)"),
        )),
        _ => WireError::Garbage(shorten(&v.to_string())),
    }
}

fn parse<T: for<'de> Deserialize<'de>>(v: Value) -> Result<T, WireError> {
    if v.get("error").is_some() {
        return Err(error_of(&v));
    }
    if !v.is_object() {
        return Err(WireError::Garbage(shorten(&v.to_string())));
    }
    serde_json::from_value(v).map_err(|e| WireError::Garbage(shorten(&e.to_string())))
}

/// Error texts from the other end go into logs and D-Bus errors: bounded.
fn shorten(s: &str) -> String {
    s.chars().take(200).flat_map(char::escape_default).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn j(s: &str) -> Value {
        serde_json::from_str(s).unwrap()
    }

    #[test]
    fn answers_as_etcd_sends_them() {
        // Taken from etcd 3.4's gateway on this project's test machine.
        let won = j(
            r#"{"header":{"cluster_id":"32","member_id":"33","revision":"2","raft_term":"2"},
            "succeeded":true,"responses":[{"response_put":{"header":{"revision":"2"}}}]}"#,
        );
        assert_eq!(parse_campaign(won), Ok(Campaign::Won { epoch: 2 }));
        let held = j(
            r#"{"header":{"revision":"2"},"responses":[{"response_range":{"header":
            {"revision":"2"},"kvs":[{"key":"L2Ryb3Zlci9sZWFkZXI=","create_revision":"2",
            "mod_revision":"2","version":"1","value":"bWU=","lease":"2324035674260946695"}],
            "count":"1"}}]}"#,
        );
        let Ok(Campaign::Held {
            holder: Some(kv),
            revision: 2,
        }) = parse_campaign(held)
        else {
            panic!("not held");
        };
        assert_eq!(kv.key, b"/drover/leader");
        assert_eq!(kv.value, b"me");
        assert_eq!(kv.create_revision, 2);
        assert_eq!(kv.lease, 2324035674260946695);
        let grant = j(r#"{"header":{"revision":"1"},"ID":"2324035674260946693","TTL":"2"}"#);
        assert_eq!(
            parse_grant(grant),
            Ok(Lease {
                id: 2324035674260946693,
                ttl: 2
            })
        );
        let alive = j(r#"{"result":{"header":{"revision":"2"},"ID":"23","TTL":"2"}}"#);
        assert_eq!(parse_keepalive(alive), Ok(2));
        let lost = j(r#"{"result":{"header":{"revision":"2"},"ID":"12345"}}"#);
        assert_eq!(parse_keepalive(lost), Ok(0));
        let err = j(r#"{"error":"etcdserver: requested lease not found","code":5}"#);
        assert_eq!(
            parse_keepalive(err),
            Err(WireError::Etcd(
                "etcdserver: requested lease not found".into()
            ))
        );
        let created = j(r#"{"result":{"header":{"revision":"3"},"created":true}}"#);
        assert_eq!(parse_watch(created), Ok(Watched::Nothing));
        let deleted = j(
            r#"{"result":{"header":{"revision":"3"},"events":[{"kv":{"key":"L2Q=",
            "create_revision":"2","mod_revision":"2","value":"bWU="}},{"type":"DELETE",
            "kv":{"key":"L2Q=","mod_revision":"3"}}]}}"#,
        );
        assert_eq!(parse_watch(deleted), Ok(Watched::Deleted));
        let alive = j(r#"{"header":{"revision":"1"},"ID":"27","TTL":"5","grantedTTL":"7"}"#);
        assert_eq!(parse_time_to_live(alive), Ok(Some(7)));
        let gone = j(r#"{"header":{"revision":"1"},"ID":"27","TTL":"-1"}"#);
        assert_eq!(parse_time_to_live(gone), Ok(None));
        let huge = j(r#"{"ID":"27","TTL":"5","grantedTTL":"99999999"}"#);
        assert_eq!(parse_time_to_live(huge), Ok(Some(MAX_GRANTED_S as u64)));
        let absent = j(r#"{"header":{"revision":"1"}}"#);
        assert_eq!(parse_range(absent), Ok((None, 1)));
        let present = j(
            r#"{"header":{"revision":"2"},"kvs":[{"key":"L3gvbGVhZGVy","create_revision":"2",
            "mod_revision":"2","version":"1","value":"eA==","lease":"9"}],"count":"1"}"#,
        );
        let Ok((Some(kv), 2)) = parse_range(present) else {
            panic!("no key");
        };
        assert_eq!(
            (kv.create_revision, kv.lease, kv.value),
            (2, 9, b"x".to_vec())
        );
        let compacted = j(r#"{"result":{"header":{"revision":"9"},"compact_revision":"5"}}"#);
        assert!(matches!(parse_watch(compacted), Ok(Watched::Ended(_))));
    }

    #[test]
    fn garbage_is_an_error() {
        for bad in [
            "null",
            "[]",
            "1",
            r#""text""#,
            r#"{"header":{"revision":"x"},"succeeded":true}"#,
            r#"{"header":{"revision":"-1"},"succeeded":true}"#,
            r#"{"succeeded":true}"#,
            r#"{"header":{"revision":"2"},"responses":[{"response_range":{"kvs":[{"key":"***"}]}}]}"#,
            r#"{"header":{"revision":"99999999999999999999"}}"#,
            r#"{"error":{"message":"x"}}"#,
        ] {
            assert!(parse_campaign(j(bad)).is_err(), "{bad}");
        }
        for bad in [
            "{}",
            r#"{"ID":"0","TTL":"5"}"#,
            r#"{"ID":"1"}"#,
            r#"{"ID":[],"TTL":1}"#,
        ] {
            assert!(parse_grant(j(bad)).is_err(), "{bad}");
        }
        for bad in ["{}", "[]", r#"{"result":[]}"#, r#"{"result":{"TTL":"z"}}"#] {
            assert!(parse_keepalive(j(bad)).is_err(), "{bad}");
        }
        for bad in [
            "{}",
            "[]",
            r#"{"result":[]}"#,
            r#"{"result":{"events":"z"}}"#,
        ] {
            assert!(parse_watch(j(bad)).is_err(), "{bad}");
        }
        for bad in [
            "{}",
            "[]",
            r#"{"kvs":[]}"#,
            r#"{"header":{"revision":"1"},"kvs":"z"}"#,
        ] {
            assert!(parse_range(j(bad)).is_err(), "{bad}");
        }
        for bad in [
            "[]",
            r#"{"TTL":"z"}"#,
            r#"{"error":"etcdserver: no leader"}"#,
        ] {
            assert!(parse_time_to_live(j(bad)).is_err(), "{bad}");
        }
        let long = format!(r#"{{"error":"{}"}}"#, "x".repeat(10_000));
        let Err(WireError::Etcd(msg)) = parse_keepalive(j(&long)) else {
            panic!("not an etcd error");
        };
        assert!(msg.len() <= 200);
    }

    /// The campaign is the only write the election makes to etcd's keys
    /// (docs/dev/ha.md, "Writes"): its whole shape is pinned here. Create
    /// `key` with our lease only if it does not exist (`create_revision ==
    /// 0`, the one compare), else read it; no other operation, no delete,
    /// no put without the compare.
    #[test]
    fn the_campaign_transaction_is_exactly_create_if_absent() {
        let k = encode(b"/drover/prod/leader");
        assert_eq!(
            campaign_body(b"/drover/prod/leader", b"mgr-a:842", 7_000_000_000),
            json!({
                "compare": [{
                    "key": k, "target": "CREATE", "result": "EQUAL", "create_revision": "0"
                }],
                "success": [{"request_put": {
                    "key": k, "value": encode(b"mgr-a:842"), "lease": "7000000000"
                }}],
                "failure": [{"request_range": {"key": k}}],
            })
        );
    }

    #[test]
    fn bodies() {
        let b = campaign_body(b"/d/leader", b"h:1", 42);
        assert_eq!(b["compare"][0]["create_revision"], "0");
        assert_eq!(b["success"][0]["request_put"]["lease"], "42");
        assert_eq!(b["success"][0]["request_put"]["key"], encode(b"/d/leader"));
        assert_eq!(
            watch_body(b"/k", 5)["create_request"]["start_revision"],
            "5"
        );
    }
}
