//! Which manager the agent obeys when it knows several (the managers of a
//! high-availability group, `ControllerHost=` / `ControllerAddress=` lists).
//!
//! Every manager's welcome carries its leadership epoch (0 for a manager
//! without etcd; it rises with every new leader). [`Follow`] judges each
//! welcome ([`Follow::offer`]):
//!
//! * an epoch **lower than the highest this agent has seen** is refused,
//!   whatever else: a deposed leader (resumed from `SIGSTOP`, cut from
//!   etcd and back) is never obeyed again, even when no other manager is
//!   reachable;
//! * with no session, the welcome is taken;
//! * during a session, a welcome with a **higher** epoch than the session's
//!   is taken (the new leader; the old session ends), one with the same or
//!   a lower epoch is turned down (the session stays).
//!
//! The highest epoch lives in memory, for the life of the process: a
//! restarted agent learns it again from the first manager that welcomes it
//! (an etcd whose data was wiped starts its revisions again; agents started
//! since then follow it, older ones refuse it until restarted).
//!
//! Pure: no I/O, so the rules are unit-tested here; the link
//! (`crate::connection`) applies them to real welcomes.

/// What to do with a manager's welcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Take the session (the first, or a newer leader: the current one
    /// ends).
    Take,
    /// Keep the current session; close this link. `current`: its epoch.
    Keep { current: u64 },
    /// The epoch is lower than the highest seen: never obeyed.
    Refuse { highest: u64 },
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct Follow {
    highest: u64,
    current: Option<u64>,
}

impl Follow {
    /// The highest epoch any manager welcomed this agent with.
    pub fn highest(&self) -> u64 {
        self.highest
    }

    /// The epoch of the session in progress, if any.
    pub fn current(&self) -> Option<u64> {
        self.current
    }

    /// Judges a welcome with `epoch`; [`Verdict::Take`] makes it the
    /// current session.
    pub fn offer(&mut self, epoch: u64) -> Verdict {
        if epoch < self.highest {
            return Verdict::Refuse {
                highest: self.highest,
            };
        }
        match self.current {
            Some(current) if epoch <= current => Verdict::Keep { current },
            _ => {
                self.highest = epoch;
                self.current = Some(epoch);
                Verdict::Take
            }
        }
    }

    /// The current session ended (the highest epoch stays).
    pub fn ended(&mut self) {
        self.current = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_welcome_is_taken_and_a_newer_leader_replaces_it() {
        let mut f = Follow::default();
        assert_eq!(f.offer(7), Verdict::Take);
        assert_eq!((f.current(), f.highest()), (Some(7), 7));
        // The same epoch (the leader through another address) or a standby's
        // older one: the session stays.
        assert_eq!(f.offer(7), Verdict::Keep { current: 7 });
        assert_eq!(f.offer(3), Verdict::Refuse { highest: 7 });
        // A new leader: taken while the old session still runs.
        assert_eq!(f.offer(9), Verdict::Take);
        assert_eq!((f.current(), f.highest()), (Some(9), 9));
    }

    #[test]
    fn a_lower_epoch_is_refused_even_with_no_session() {
        let mut f = Follow::default();
        assert_eq!(f.offer(12), Verdict::Take);
        f.ended();
        assert_eq!(f.current(), None);
        // The deposed leader resumes and welcomes the agent: refused, also
        // when nothing else is reachable.
        assert_eq!(f.offer(11), Verdict::Refuse { highest: 12 });
        assert_eq!(f.offer(0), Verdict::Refuse { highest: 12 });
        assert_eq!(f.current(), None);
        // The same leader again (its session was lost): taken.
        assert_eq!(f.offer(12), Verdict::Take);
        f.ended();
        assert_eq!(f.offer(13), Verdict::Take);
        assert_eq!(f.highest(), 13);
    }

    #[test]
    fn managers_without_etcd_are_epoch_zero_and_followed_as_before() {
        let mut f = Follow::default();
        for _ in 0..3 {
            assert_eq!(f.offer(0), Verdict::Take);
            f.ended();
        }
        assert_eq!(f.offer(0), Verdict::Take);
        assert_eq!(f.offer(0), Verdict::Keep { current: 0 });
        assert_eq!(f.offer(u64::MAX), Verdict::Take);
        assert_eq!(f.offer(u64::MAX - 1), Verdict::Refuse { highest: u64::MAX });
    }
}
