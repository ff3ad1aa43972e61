//! Modification tags: `(guid, index)` on every unit-state record and event.
//!
//! `guid` names one agent session (the manager hands out a fresh one on every
//! registration); `index` rises by one with every event the agent sends in that
//! session. Rules (docs/dev/architecture.md, "Unit subscriptions and modification tags"):
//!
//! * an **update** is applied only if its tag *succeeds* the stored one: a
//!   different guid (a newer session replaces what an older one said), or the
//!   same guid and a larger index;
//! * a **removal** is applied if its tag succeeds *or equals* the stored one.
//!
//! Guids are handed out by the manager in increasing order, so "different guid"
//! can be refined to "larger guid": a late event from an older session can then
//! never resurrect state written by a newer one.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ModTag {
    pub guid: u64,
    pub index: u64,
}

impl ModTag {
    pub const ZERO: ModTag = ModTag { guid: 0, index: 0 };

    pub fn new(guid: u64, index: u64) -> Self {
        Self { guid, index }
    }

    /// True if an update carrying `self` may replace a record tagged `stored`.
    pub fn succeeds(&self, stored: &ModTag) -> bool {
        self.guid > stored.guid || (self.guid == stored.guid && self.index > stored.index)
    }

    /// True if a removal carrying `self` may remove a record tagged `stored`.
    pub fn may_remove(&self, stored: &ModTag) -> bool {
        self == stored || self.succeeds(stored)
    }
}

/// Issues the tags of one session: same guid, index rising by one per event.
#[derive(Debug, Clone)]
pub struct TagCounter {
    guid: u64,
    index: u64,
}

impl TagCounter {
    pub fn new(guid: u64) -> Self {
        Self { guid, index: 0 }
    }

    /// The last tag issued (index 0 before the first).
    pub fn last(&self) -> ModTag {
        ModTag::new(self.guid, self.index)
    }

    pub fn next_tag(&mut self) -> ModTag {
        self.index += 1;
        ModTag::new(self.guid, self.index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordering_rules() {
        let a1 = ModTag::new(1, 1);
        let a2 = ModTag::new(1, 2);
        let b1 = ModTag::new(2, 1);
        assert!(a2.succeeds(&a1));
        assert!(!a1.succeeds(&a2));
        assert!(!a1.succeeds(&a1));
        assert!(b1.succeeds(&a2));
        assert!(!a2.succeeds(&b1));
        assert!(a1.may_remove(&a1));
        assert!(!a1.may_remove(&a2));
    }
}
