//! The reference rules' input from requesting agents: `ProxyNew` (a new
//! proxy, a resume after a reconnect, a re-add, a replay of an outcome the
//! requester missed) and `ProxyRemoved`.

use super::*;

impl References {
    /// `Event::ProxyNew` of a `drover-proxy@` proxy (see
    /// [`References::proxy_new_of`]).
    pub fn proxy_new(
        &mut self,
        a: &NodeName,
        session: u64,
        b: &NodeName,
        unit: &UnitName,
        proxy_id: u64,
        now: Instant,
    ) -> Vec<Action> {
        self.proxy_new_of(ProxyTemplate::Drover, a, session, b, unit, proxy_id, now)
    }

    /// `Event::ProxyNew` from node `a` in `session`, of a proxy unit of the
    /// family `template`. A reference that waits for a target on an offline
    /// node is told so.
    #[allow(clippy::too_many_arguments)]
    pub fn proxy_new_of(
        &mut self,
        template: ProxyTemplate,
        a: &NodeName,
        session: u64,
        b: &NodeName,
        unit: &UnitName,
        proxy_id: u64,
        now: Instant,
    ) -> Vec<Action> {
        let mut out = Vec::new();
        if let Err(message) = self.policy.check(a, b) {
            self.stats.error(if self.policy.known.contains(b) {
                ErrorReason::NotAllowed
            } else {
                ErrorReason::UnknownNode
            });
            out.push(Action::Notify {
                to: a.clone(),
                session,
                notice: Notice::ProxyError {
                    proxy_id,
                    message: message.clone(),
                },
            });
            // Shown by ListProxies only for a known target node: an
            // unknown one would let an agent fill the table with garbage.
            if self.policy.known.contains(b) {
                let seq = self.next_seq;
                self.next_seq += 1;
                let target = self
                    .targets
                    .entry((b.clone(), unit.clone()))
                    .or_insert_with(Target::new);
                target.drop_dead_of(a);
                target.refs.insert(
                    (a.clone(), seq),
                    Ref {
                        proxy_id,
                        template,
                        session,
                        state: RefState::Failed(message),
                        added_gen: 0,
                        grace_until: None,
                        tally: Tally::new(&self.stats, Slot::Failed, now),
                    },
                );
                self.settle(b, unit, &mut out);
                self.evict_dead(a);
            }
            return out;
        }

        let key = (b.clone(), unit.clone());
        let found = self
            .targets
            .get(&key)
            .map_or(Announcement::Readd(None), |t| {
                t.announcement(a, proxy_id, session)
            });
        match found {
            // A re-announces after a reconnect: resume, nothing on B.
            Announcement::Resume(seq) => {
                let rk = (a.clone(), seq);
                if let Some(target) = self.targets.get_mut(&key)
                    && let Some(r) = target.refs.get_mut(&rk)
                {
                    r.session = session;
                    r.proxy_id = proxy_id;
                    r.grace_until = None;
                }
                self.replay(&rk, b, unit, &mut out);
                self.tell_node_offline(&rk, b, unit, now, &mut out);
            }
            // The same proxy again after it failed or ended: tell it again.
            Announcement::TellAgain(seq) => {
                let Some(r) = self
                    .targets
                    .get_mut(&key)
                    .and_then(|t| t.refs.get_mut(&(a.clone(), seq)))
                else {
                    return out;
                };
                r.session = session;
                r.grace_until = None;
                let notice = match &r.state {
                    RefState::Failed(message) => Notice::ProxyError {
                        proxy_id,
                        message: message.clone(),
                    },
                    RefState::Ended(change) => Notice::ProxyTarget {
                        proxy_id,
                        change: change.clone(),
                    },
                    // Excluded by `announcement`.
                    RefState::Waiting | RefState::Active => return out,
                };
                out.push(Action::Notify {
                    to: a.clone(),
                    session,
                    notice,
                });
            }
            // New, or a duplicate of this session: (re)add.
            Announcement::Readd(replaced) => {
                let generation = self.bump();
                let seq = self.next_seq;
                self.next_seq += 1;
                let target = self.targets.entry(key).or_insert_with(Target::new);
                match replaced {
                    Some(old) => {
                        target.refs.remove(&(a.clone(), old));
                    }
                    None => target.drop_dead_of(a),
                }
                target.refs.insert(
                    (a.clone(), seq),
                    Ref {
                        proxy_id,
                        template,
                        session,
                        state: RefState::Waiting,
                        added_gen: generation,
                        grace_until: None,
                        tally: Tally::new(&self.stats, Slot::Waiting, now),
                    },
                );
                target.want = Want {
                    running: true,
                    generation,
                };
                // Nothing is replayed: a waiting reference hears of its
                // target once B confirms the dep start (see `target_event`).
                self.tell_node_offline(&(a.clone(), seq), b, unit, now, &mut out);
                self.settle(b, unit, &mut out);
            }
        }
        out
    }

    /// `Event::ProxyRemoved` from node `a`. Only the reference with this id
    /// goes: a late removal of an older proxy never drops its replacement,
    /// and A's other proxies of the same target keep theirs.
    /// A failed one stays listed for one grace period (the agent forgets a
    /// failed proxy at once; an operator running `droverctl proxies` a bit
    /// later should still see why it failed).
    pub fn proxy_removed(
        &mut self,
        a: &NodeName,
        b: &NodeName,
        unit: &UnitName,
        proxy_id: u64,
        now: Instant,
    ) -> Vec<Action> {
        let mut out = Vec::new();
        let key = (b.clone(), unit.clone());
        let grace = self.policy.grace;
        let Some(target) = self.targets.get_mut(&key) else {
            return out;
        };
        let Some((rk, r)) = target
            .refs
            .iter_mut()
            .find(|((n, _), r)| n == a && r.proxy_id == proxy_id)
        else {
            return out;
        };
        if matches!(r.state, RefState::Failed(_)) {
            r.grace_until = Some(now + grace);
        } else {
            let rk = rk.clone();
            target.refs.remove(&rk);
        }
        self.settle(b, unit, &mut out);
        out
    }
}
