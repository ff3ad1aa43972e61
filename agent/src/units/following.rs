//! What the unit stream follows, and the bookkeeping that decides it.
//!
//! The stream ([`crate::systemd::api::Systemd::unit_stream`]) follows what
//! the manager's session watches (the view's
//! [`crate::units::rules::View::wanted`]) plus what is **held**: a unit
//! (`None`: every unit) held by [`Following::hold`] for a subscription on
//! its way (at the subscription's scope), a `StartDep` whose target the
//! unit fence must see go active (its state: [`Scope::State`]), or health
//! once a unit declares a check (every unit's state, for as long as any
//! unit declares one: `crate::agent`), counted per holder and scope; a unit
//! held or watched at two scopes is followed at the wider, and every unit is
//! followed at the widest scope anything wants of any unit
//! ([`Holds::wanted`]). When nothing is watched or held, it follows nothing
//! but the jobs, and systemd's other signals do not even reach the agent.
//!
//! Invariants:
//! * Changes are made one at a time (the `state` lock, taken before the
//!   hub's send order and view); each gets the next id, and the stream marks
//!   it with a snapshot the reader applies ([`Following::applied`]), so a
//!   caller that waits for its id ([`Following::caught_up`]) finds the cache
//!   covering what it asked for.
//! * A failed change changes nothing: what the stream follows stays as it
//!   was, a failed hold holds nothing, and the next change tries again.
//! * A unit held n times is followed until the n-th release.

use crate::systemd::api::Followed;
use drover_protocol::{RemoteError, Scope, UnitName};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;
use std::time::Duration;

/// Changes what the unit stream follows: `Systemd::follow` of the agent's
/// systemd, kept without its type.
pub type Follower = Box<
    dyn Fn(Followed, u64) -> Pin<Box<dyn Future<Output = Result<(), RemoteError>> + Send>>
        + Send
        + Sync,
>;

/// What one holder holds: a unit (`None`: every unit) at a scope.
pub type Held = (Option<UnitName>, Scope);

/// What is held and its number of holders. Plain data.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Holds(HashMap<Held, usize>);

impl Holds {
    /// One more holder of `held`.
    pub fn add(&mut self, held: &Held) {
        *self.0.entry(held.clone()).or_default() += 1;
    }

    /// One holder of `held` fewer; nothing if it was not held.
    pub fn remove(&mut self, held: &Held) {
        if let Some(n) = self.0.get_mut(held) {
            *n -= 1;
            if *n == 0 {
                self.0.remove(held);
            }
        }
    }

    /// What the stream must follow: what is `watched` and what is held.
    /// When every unit is watched or held, every unit at the widest scope
    /// any of them is wanted at (a unit watched by a monitor while health
    /// holds every unit's state makes it every unit, everything).
    pub fn wanted(&self, watched: Followed) -> Followed {
        let (mut every, units) = match watched {
            Followed::Every(scope) => (Some(scope), BTreeMap::new()),
            Followed::Units(units) => (None, units),
        };
        let mut widest = units.values().copied().max();
        for (unit, scope) in self.0.keys() {
            if unit.is_none() {
                every = every.max(Some(*scope));
            }
            widest = widest.max(Some(*scope));
        }
        if let Some(every) = every {
            return Followed::Every(widest.map_or(every, |w| w.max(every)));
        }
        let held = self
            .0
            .keys()
            .filter_map(|(unit, scope)| unit.clone().map(|u| (u, *scope)));
        Followed::units(units.into_iter().chain(held))
    }
}

/// What the stream follows now, the id of its last change, what is held.
struct State {
    now: Followed,
    last_id: u64,
    holds: Holds,
}

/// See the module docs. Lives in the unit hub.
pub struct Following {
    follower: OnceLock<Follower>,
    /// Held by whoever changes what is followed, across the change.
    state: tokio::sync::Mutex<State>,
    /// The id of the last change whose snapshot the reader applied.
    applied: tokio::sync::watch::Sender<u64>,
}

impl Default for Following {
    fn default() -> Self {
        Self {
            follower: OnceLock::new(),
            state: tokio::sync::Mutex::new(State {
                now: Followed::nothing(),
                last_id: 0,
                holds: Holds::default(),
            }),
            applied: tokio::sync::watch::Sender::new(0),
        }
    }
}

impl Following {
    /// The stream started: `follower` changes what it follows. Set once; a
    /// second call changes nothing.
    pub fn started(&self, follower: Follower) {
        let _ = self.follower.set(follower);
    }

    /// Makes the stream follow what is wanted now (`watched()` and what is
    /// held, after `change` to the holds, which stays done either way).
    /// Returns the id of the change in effect: this one, or the last one if
    /// nothing changed.
    pub async fn refollow(
        &self,
        change: impl FnOnce(&mut Holds),
        watched: impl FnOnce() -> Followed,
    ) -> Result<u64, RemoteError> {
        let mut state = self.state.lock().await;
        change(&mut state.holds);
        let wanted = state.holds.wanted(watched());
        if state.now == wanted {
            return Ok(state.last_id);
        }
        let follower = self
            .follower
            .get()
            .ok_or_else(|| RemoteError::failed("the unit stream has not started"))?;
        let id = state.last_id + 1;
        tracing::debug!(id, following = %wanted, "following systemd's units");
        follower(wanted.clone(), id).await?;
        state.last_id = id;
        state.now = wanted;
        Ok(id)
    }

    /// One more holder of `held` (a unit or every unit, at a scope), and
    /// the stream follows it: its match rules are on the bus when this
    /// returns. Returns the change to wait for before relying on the cache.
    /// An error holds nothing.
    pub async fn hold(
        &self,
        held: &Held,
        watched: impl FnOnce() -> Followed,
    ) -> Result<u64, RemoteError> {
        let result = self.refollow(|holds| holds.add(held), watched).await;
        if result.is_err() {
            self.state.lock().await.holds.remove(held);
        }
        result
    }

    /// One holder of `held` fewer; the stream then follows what is left.
    pub async fn release(
        &self,
        held: &Held,
        watched: impl FnOnce() -> Followed,
    ) -> Result<u64, RemoteError> {
        self.refollow(|holds| holds.remove(held), watched).await
    }

    /// The reader applied the snapshot of change `id`.
    pub fn applied(&self, id: u64) {
        self.applied
            .send_modify(|applied| *applied = (*applied).max(id));
    }

    /// Waits at most `patience` until the reader applied the snapshot of
    /// change `id`.
    pub async fn caught_up(&self, id: u64, patience: Duration) -> Result<(), RemoteError> {
        let mut applied = self.applied.subscribe();
        match tokio::time::timeout(patience, applied.wait_for(|a| *a >= id)).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(RemoteError::failed(
                "the unit signal reader did not catch up with systemd",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    fn unit(s: &str) -> Option<UnitName> {
        Some(UnitName::new(s).unwrap())
    }

    /// `s` held for its state (a `StartDep`'s hold).
    fn state(s: &str) -> Held {
        (unit(s), Scope::State)
    }

    fn every(s: &str) -> Held {
        (unit(s), Scope::Everything)
    }

    /// Every interface of each of `names`.
    fn units(names: &[&str]) -> Followed {
        Followed::units(names.iter().map(|n| (unit(n).unwrap(), Scope::Everything)))
    }

    #[test]
    fn holds_add_to_what_is_watched_until_the_last_holder_releases() {
        let mut holds = Holds::default();
        assert_eq!(holds.wanted(Followed::nothing()), Followed::nothing());
        holds.add(&every("db.service"));
        holds.add(&every("db.service"));
        assert_eq!(
            holds.wanted(units(&["a.service"])),
            units(&["a.service", "db.service"])
        );
        holds.remove(&every("db.service"));
        assert_eq!(holds.wanted(Followed::nothing()), units(&["db.service"]));
        holds.remove(&every("db.service"));
        assert_eq!(holds.wanted(Followed::nothing()), Followed::nothing());
        // A release without a hold changes nothing.
        holds.remove(&every("db.service"));
        assert_eq!(holds, Holds::default());
        // Every unit, held or watched, is every unit.
        holds.add(&(None, Scope::Everything));
        assert_eq!(
            holds.wanted(units(&["a.service"])),
            Followed::Every(Scope::Everything)
        );
        holds.remove(&(None, Scope::Everything));
        assert_eq!(
            Holds::default().wanted(Followed::Every(Scope::Everything)),
            Followed::Every(Scope::Everything),
            "watched *"
        );
    }

    #[test]
    fn every_unit_is_followed_at_the_widest_scope_anything_wants() {
        const STATE: Followed = Followed::Every(Scope::State);
        const ALL: Followed = Followed::Every(Scope::Everything);
        let every_state = (None, Scope::State);
        let mut holds = Holds::default();
        holds.add(&every_state);
        assert_eq!(holds.wanted(Followed::nothing()), STATE, "health alone");
        holds.add(&state("db.service"));
        assert_eq!(
            holds.wanted(Followed::nothing()),
            STATE,
            "and a StartDep's hold"
        );
        assert_eq!(
            holds.wanted(units(&["a.service"])),
            ALL,
            "a unit watched by a monitor"
        );
        assert_eq!(holds.wanted(ALL), ALL, "a monitor of *");
        holds.add(&every("db.service"));
        assert_eq!(holds.wanted(Followed::nothing()), ALL, "a wider hold");
        holds.remove(&every("db.service"));
        assert_eq!(holds.wanted(Followed::nothing()), STATE, "released");
        holds.remove(&every_state);
        assert_eq!(
            holds.wanted(Followed::nothing()),
            Followed::units([(unit("db.service").unwrap(), Scope::State)]),
            "health's hold gone: the units one by one again"
        );
    }

    #[test]
    fn a_unit_held_or_watched_at_two_scopes_is_followed_at_the_wider() {
        let db = UnitName::new("db.service").unwrap();
        let followed_as = |f: Followed| match f {
            Followed::Units(units) => units.get(&db).copied(),
            Followed::Every(scope) => Some(scope),
        };
        let mut holds = Holds::default();
        holds.add(&state("db.service"));
        assert_eq!(
            followed_as(holds.wanted(Followed::nothing())),
            Some(Scope::State),
            "a StartDep's hold follows the state alone"
        );
        assert_eq!(
            followed_as(holds.wanted(units(&["db.service"]))),
            Some(Scope::Everything),
            "watched by a monitor as well"
        );
        holds.add(&every("db.service"));
        assert_eq!(
            followed_as(holds.wanted(Followed::nothing())),
            Some(Scope::Everything)
        );
        holds.remove(&every("db.service"));
        assert_eq!(
            followed_as(holds.wanted(Followed::nothing())),
            Some(Scope::State),
            "the wider hold released: back to the state"
        );
        holds.remove(&state("db.service"));
        assert_eq!(followed_as(holds.wanted(Followed::nothing())), None);
    }

    /// The changes a follower was told of.
    type Calls = Arc<Mutex<Vec<(Followed, u64)>>>;

    /// A follower that records what it was told, failing when `fail` says.
    fn recording(fail: Arc<Mutex<bool>>) -> (Follower, Calls) {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let seen = calls.clone();
        let follower: Follower = Box::new(move |followed, id| {
            let (seen, fail) = (seen.clone(), fail.clone());
            Box::pin(async move {
                if *fail.lock().unwrap() {
                    return Err(RemoteError::failed("systemd is gone"));
                }
                seen.lock().unwrap().push((followed, id));
                Ok(())
            })
        });
        (follower, calls)
    }

    #[tokio::test]
    async fn only_real_changes_reach_systemd_and_a_failed_hold_holds_nothing() {
        let following = Following::default();
        let fail = Arc::new(Mutex::new(false));
        let (follower, calls) = recording(fail.clone());
        let nothing = || Followed::nothing();
        assert!(
            following.hold(&every("db.service"), nothing).await.is_err(),
            "not started"
        );
        following.started(follower);

        assert_eq!(following.hold(&every("db.service"), nothing).await, Ok(1));
        // A second holder changes nothing on the bus.
        assert_eq!(following.hold(&every("db.service"), nothing).await, Ok(1));
        assert_eq!(
            following.release(&every("db.service"), nothing).await,
            Ok(1)
        );
        assert_eq!(
            following.release(&every("db.service"), nothing).await,
            Ok(2)
        );
        assert_eq!(
            *calls.lock().unwrap(),
            vec![(units(&["db.service"]), 1), (Followed::nothing(), 2)]
        );

        *fail.lock().unwrap() = true;
        let all = (None, Scope::Everything);
        assert!(following.hold(&all, nothing).await.is_err());
        *fail.lock().unwrap() = false;
        // The failed hold left nothing held: nothing to change.
        assert_eq!(following.release(&all, nothing).await, Ok(2));
        let watched = || units(&["a.service"]);
        assert_eq!(following.refollow(|_| {}, watched).await, Ok(3));
        assert_eq!(calls.lock().unwrap().len(), 3);
    }

    #[tokio::test]
    async fn a_change_is_waited_for_until_the_reader_applied_it() {
        let following = Arc::new(Following::default());
        let waiting = tokio::spawn({
            let following = following.clone();
            async move { following.caught_up(2, Duration::from_secs(30)).await }
        });
        following.applied(1);
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "an older change is not this one");
        following.applied(2);
        assert_eq!(waiting.await.unwrap(), Ok(()));
        // Applied already: at once.
        assert_eq!(following.caught_up(1, Duration::ZERO).await, Ok(()));
        assert!(
            following
                .caught_up(3, Duration::from_millis(1))
                .await
                .is_err()
        );
    }
}
