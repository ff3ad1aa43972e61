//! The reference rules' exchange with target agents: the dep commands due
//! (`StartDep`/`StopDep`, one in flight per target) and their outcomes, and
//! the outcome of the orphan-dep sweep.

use super::*;

impl References {
    /// The dep commands to send now (each target at most one in flight).
    pub fn dep_commands(&mut self) -> Vec<DepCommand> {
        let mut out = Vec::new();
        for ((b, unit), target) in self.targets.iter_mut() {
            let Some(&session) = self.online.get(b) else {
                continue;
            };
            if target.needs_command() {
                target.in_flight = true;
                out.push(DepCommand {
                    node: b.clone(),
                    unit: unit.clone(),
                    start: target.want.running,
                    generation: target.want.generation,
                    session,
                });
            }
        }
        out
    }

    /// The outcome of a [`DepCommand`].
    pub fn dep_result(&mut self, cmd: &DepCommand, outcome: DepOutcome) -> Vec<Action> {
        let mut out = Vec::new();
        let key = (cmd.node.clone(), cmd.unit.clone());
        let current = self.online.get(&cmd.node) == Some(&cmd.session);
        let Some(target) = self.targets.get_mut(&key) else {
            return out;
        };
        target.in_flight = false;
        let sent = Want {
            running: cmd.start,
            generation: cmd.generation,
        };
        match outcome {
            DepOutcome::Done => {
                if current {
                    target.acked = Some(sent);
                    // The waiting references this start covers get the
                    // target's state now (see `target_event`): `active`
                    // completes them; `failed` or `inactive` is known only
                    // from news up to the end of the start job or later, so
                    // it is this start's outcome and fails them (see the
                    // module docs).
                    let covered: Vec<RefKey> = if sent.running {
                        target
                            .refs
                            .iter()
                            .filter(|(_, r)| {
                                r.state == RefState::Waiting && r.added_gen <= sent.generation
                            })
                            .map(|(rk, _)| rk.clone())
                            .collect()
                    } else {
                        Vec::new()
                    };
                    for rk in covered {
                        self.replay(&rk, &cmd.node, &cmd.unit, &mut out);
                    }
                    // A replay may have failed the last live reference.
                    self.settle(&cmd.node, &cmd.unit, &mut out);
                }
            }
            DepOutcome::Offline => {}
            // The agent's message already says which unit on which node
            // cannot start and why; it reaches the requesters unchanged.
            DepOutcome::Failed(message) if cmd.start => {
                for ((a, _), r) in target.refs.iter_mut() {
                    if r.state == RefState::Waiting && r.added_gen <= cmd.generation {
                        out.extend(r.notice(a, self.online.get(a).copied(), |proxy_id| {
                            Notice::ProxyError {
                                proxy_id,
                                message: message.clone(),
                            }
                        }));
                        r.fail(message.clone(), ErrorReason::StartFailed);
                    }
                }
                // Not retried: a newer want (a re-add) sends again.
                if current {
                    target.acked = Some(sent);
                }
                self.settle(&cmd.node, &cmd.unit, &mut out);
                let requesters: HashSet<NodeName> = self
                    .targets
                    .get(&key)
                    .map(|t| t.refs.keys().map(|(a, _)| a.clone()).collect())
                    .unwrap_or_default();
                for a in requesters {
                    self.evict_dead(&a);
                }
            }
            DepOutcome::Failed(_) => {
                // A dep that cannot be stopped is not there to stop.
                if current {
                    target.acked = Some(sent);
                }
            }
        }
        if self.targets.get(&key).is_some_and(Target::removable) {
            self.targets.remove(&key);
        }
        out
    }

    /// The running dep units of `node` (its `session`), listed for a sweep:
    /// those no live reference wants are stopped.
    pub fn sweep_result(&mut self, node: &NodeName, session: u64, running: &[UnitName]) {
        if self.online.get(node) != Some(&session) {
            return;
        }
        for unit in running {
            let key = (node.clone(), unit.clone());
            let live = self.targets.get(&key).map(Target::live).unwrap_or(0);
            if live > 0 {
                continue;
            }
            let generation = self.bump();
            let target = self.targets.entry(key).or_insert_with(Target::new);
            target.want = Want {
                running: false,
                generation,
            };
        }
    }
}
