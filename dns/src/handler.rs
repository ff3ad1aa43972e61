//! The request handler hickory-server calls for every query: checks the
//! question, finds what it names ([`crate::zone`]), takes the unit's answer
//! from the cache ([`crate::cache`]) or the source, and sends the records
//! ([`crate::records`]).
//!
//! Every reply is authoritative (AA) and never recursive (no RA). What the
//! server does not serve is said plainly: another opcode NOTIMP; a name
//! outside the zone, another class, a zone transfer REFUSED; more or fewer
//! than one question FORMERR; the manager unreachable with nothing to serve
//! SERVFAIL. A fetch runs in its own task, bounded by `fetch_timeout`, so a
//! client that goes away cannot leave it half done.

use crate::cache::{Cache, Decision, Outcome, Settings};
use crate::records::{self, EDNS_PAYLOAD, Reply, Zone};
use crate::source::{Source, SourceError};
use crate::zone::{self, Target};
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use hickory_server::authority::MessageResponseBuilder;
use hickory_server::proto::op::{Edns, Header, MessageType, OpCode, ResponseCode};
use hickory_server::proto::rr::{DNSClass, RecordType};
use hickory_server::proto::xfer::Protocol;
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

type Fetch = Shared<BoxFuture<'static, Outcome>>;

struct Inner<S> {
    source: S,
    cache: Mutex<Cache<Fetch>>,
    zone: Zone,
    fetch_timeout: Duration,
    /// The last fetch reached the manager: log only the changes.
    reachable: AtomicBool,
}

/// The handler; cheap to clone (one shared state).
pub struct Handler<S> {
    inner: Arc<Inner<S>>,
}

impl<S> Clone for Handler<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<S: Source> Handler<S> {
    pub fn new(source: S, zone: Zone, settings: Settings, fetch_timeout: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                source,
                cache: Mutex::new(Cache::new(settings)),
                zone,
                fetch_timeout,
                reachable: AtomicBool::new(true),
            }),
        }
    }

    fn cache(&self) -> MutexGuard<'_, Cache<Fetch>> {
        // Nothing panics while holding the lock; a poisoned one is still sound.
        self.inner.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `Where` calls made so far.
    pub fn fetches(&self) -> u64 {
        self.cache().fetches()
    }

    /// The answer for `unit`: cached, joined, or fetched now.
    pub async fn lookup(&self, unit: &str) -> Outcome {
        let decision = {
            let mut cache = self.cache();
            let now = Instant::now();
            match cache.decide(unit, now) {
                Decision::Fetch => {
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    let fetch: Fetch = rx
                        .map(|r| r.unwrap_or(Outcome::Unavailable))
                        .boxed()
                        .shared();
                    if cache.started(unit, fetch.clone(), now) {
                        // Spawned after the entry knows its fetch, so the
                        // fetch always finds it when it ends.
                        drop(cache);
                        self.spawn_fetch(unit.to_string(), tx);
                        Decision::Wait(fetch)
                    } else {
                        Decision::Ready(Outcome::Unavailable)
                    }
                }
                other => other,
            }
        };
        match decision {
            Decision::Ready(outcome) => outcome,
            Decision::Wait(fetch) => fetch.await,
            Decision::Fetch => Outcome::Unavailable,
        }
    }

    fn spawn_fetch(&self, unit: String, tx: tokio::sync::oneshot::Sender<Outcome>) {
        let this = self.clone();
        tokio::spawn(async move {
            let inner = &this.inner;
            let result =
                match tokio::time::timeout(inner.fetch_timeout, inner.source.lookup(&unit)).await {
                    Ok(result) => result,
                    Err(_) => Err(SourceError(format!(
                        "no answer within {:?}",
                        inner.fetch_timeout
                    ))),
                };
            match &result {
                Ok(_) => {
                    if !inner.reachable.swap(true, Ordering::Relaxed) {
                        tracing::info!("the manager answers again; fresh answers from now on");
                    }
                }
                Err(e) => {
                    if inner.reachable.swap(false, Ordering::Relaxed) {
                        tracing::warn!(
                            "asking the manager where {unit} runs failed ({e}); serving the last good answers (stale) until it answers again"
                        );
                    } else {
                        tracing::debug!("Where {unit} failed: {e}");
                    }
                }
            }
            let outcome = this.cache().finished(&unit, result, Instant::now());
            // Nobody waiting any more is fine.
            let _ = tx.send(outcome);
        });
    }

    /// The reply to one request.
    pub async fn reply(&self, request: &Request) -> Reply {
        let zone = &self.inner.zone;
        if request.op_code() != OpCode::Query {
            return Reply::code(ResponseCode::NotImp);
        }
        let queries = request.queries();
        let [query] = queries else {
            return Reply::code(ResponseCode::FormErr);
        };
        let qname = query.name();
        let qtype = query.query_type();
        if !matches!(query.query_class(), DNSClass::IN | DNSClass::ANY)
            || !zone::in_zone(&zone.origin, qname)
            || matches!(qtype, RecordType::AXFR | RecordType::IXFR)
        {
            return Reply::code(ResponseCode::Refused);
        }
        let below = usize::from(qname.num_labels() - zone.origin.num_labels());
        let labels: Vec<&[u8]> = qname.iter().take(below).collect();
        let Some(target) = zone::parse(&labels) else {
            return Reply::negative(zone, ResponseCode::NXDomain);
        };
        let room = records::room(request.protocol() == Protocol::Udp, udp_payload(request));
        let echoed = query.original().name();
        let (answer, ttl) = match &target {
            Target::Apex => (Default::default(), 0),
            Target::Unit { unit, .. } | Target::Srv { unit, .. } => {
                match self.lookup(unit.as_str()).await {
                    Outcome::Answer { answer, ttl } => (answer, ttl),
                    Outcome::Unavailable => return Reply::code(ResponseCode::ServFail),
                }
            }
        };
        records::reply(zone, echoed, qtype, &target, &answer, ttl, room)
    }
}

fn udp_payload(request: &Request) -> u16 {
    request.edns().map_or(512, Edns::max_payload)
}

#[async_trait::async_trait]
impl<S: Source> RequestHandler for Handler<S> {
    async fn handle_request<R: ResponseHandler>(
        &self,
        request: &Request,
        mut response_handle: R,
    ) -> ResponseInfo {
        let reply = if request.message_type() == MessageType::Query {
            self.reply(request).await
        } else {
            Reply::code(ResponseCode::FormErr)
        };
        let mut header = Header::response_from_request(request.header());
        header.set_authoritative(true);
        header.set_recursion_available(false);
        header.set_truncated(reply.truncated);
        header.set_response_code(reply.code);
        let mut builder = MessageResponseBuilder::from_message_request(request);
        if request.edns().is_some() {
            let mut edns = Edns::new();
            edns.set_max_payload(EDNS_PAYLOAD);
            builder.edns(edns);
        }
        let message = builder.build(
            header,
            reply.answers.iter(),
            std::iter::empty(),
            reply.authority.iter(),
            reply.additionals.iter(),
        );
        match response_handle.send_response(message).await {
            Ok(info) => info,
            Err(e) => {
                tracing::debug!("sending a reply to {} failed: {e}", request.src());
                let mut failed = header;
                failed.set_response_code(ResponseCode::ServFail);
                failed.into()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::{Answer, Row};
    use hickory_server::proto::rr::Name;
    use std::sync::atomic::AtomicU32;

    /// A source that counts calls, answers what it is told, and holds every
    /// call until the test opens the gate.
    struct Fake {
        calls: AtomicU32,
        fail: AtomicBool,
        gate: tokio::sync::Semaphore,
    }

    impl Source for Arc<Fake> {
        async fn lookup(&self, unit: &str) -> Result<Answer, SourceError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let _permit = self.gate.acquire().await;
            if self.fail.load(Ordering::SeqCst) {
                return Err(SourceError("manager gone".into()));
            }
            Ok(Answer {
                rows: vec![Row {
                    node: format!("on-{unit}"),
                    address: "10.0.0.1".into(),
                    ports: vec![],
                }],
                complete: true,
            })
        }
    }

    fn handler(fake: &Arc<Fake>, ttl: Duration) -> Handler<Arc<Fake>> {
        let zone = Zone::new(Name::from_ascii("drover.").unwrap(), 1, 1).unwrap();
        Handler::new(
            fake.clone(),
            zone,
            Settings {
                ttl,
                stale_ttl: Duration::from_secs(30),
                max_stale: Duration::from_secs(3600),
                capacity: 100,
                rate: 100,
            },
            Duration::from_secs(5),
        )
    }

    fn node_of(o: &Outcome) -> (String, u32) {
        match o {
            Outcome::Answer { answer, ttl } => (answer.rows[0].node.clone(), *ttl),
            Outcome::Unavailable => panic!("unavailable"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_queries_share_one_where_call() {
        let fake = Arc::new(Fake {
            calls: AtomicU32::new(0),
            fail: AtomicBool::new(false),
            gate: tokio::sync::Semaphore::new(0),
        });
        let h = handler(&fake, Duration::from_secs(60));
        let queries: Vec<_> = (0..50)
            .map(|_| {
                let h = h.clone();
                tokio::spawn(async move { h.lookup("web.service").await })
            })
            .collect();
        // Every query is waiting on the one call in flight.
        while fake.calls.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        fake.gate.add_permits(1000);
        for q in queries {
            assert_eq!(node_of(&q.await.unwrap()).0, "on-web.service");
        }
        assert_eq!(fake.calls.load(Ordering::SeqCst), 1);
        assert_eq!(h.fetches(), 1);
        // Fresh: answered from the cache.
        assert_eq!(node_of(&h.lookup("web.service").await).0, "on-web.service");
        assert_eq!(fake.calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unreachable_manager_gets_stale_answers_then_servfail_for_the_unknown() {
        let fake = Arc::new(Fake {
            calls: AtomicU32::new(0),
            fail: AtomicBool::new(false),
            gate: tokio::sync::Semaphore::new(1000),
        });
        let h = handler(&fake, Duration::from_millis(1));
        assert_eq!(node_of(&h.lookup("web.service").await).1, 0);
        fake.fail.store(true, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(5)).await;
        let stale = h.lookup("web.service").await;
        assert_eq!(node_of(&stale), ("on-web.service".into(), 30));
        assert_eq!(h.lookup("db.service").await, Outcome::Unavailable);
        assert_eq!(fake.calls.load(Ordering::SeqCst), 3);
    }
}
