//! Numbering of API call attempts.
//!
//! Hermes fires `pre_api_request` once per attempt with the *same*
//! `api_request_id` on a retry, and closes each attempt with either
//! `api_request_error` or `post_api_request`. The collector needs to know which
//! attempt an event belongs to, so the sender numbers them in seq order.
//!
//! Owns: the per-`api_request_id` attempt counters.
//!
//! Invariants:
//! - Events are fed in ascending seq order (the sender sorts each batch).
//! - A `pre_api_request` opens attempt `count + 1`; the next
//!   `post_api_request`/`api_request_error` of that id closes it with the same
//!   number. A close with no open attempt (capture level `lean` registers no
//!   `pre_api_request`) is attempt `count + 1` and advances the count.
//! - Bounded: an id's entry is removed when its turn ends (`post_llm_call` or
//!   `on_session_end` with the same `turn_id`), and at most `cap` ids are kept
//!   (the oldest is forgotten first).

use std::collections::{HashMap, VecDeque};

use hermes_proto::hooks;
use hermes_proto::v1::{Event, event::Body};

/// Default maximum number of tracked `api_request_id`s.
pub const DEFAULT_MAX_TRACKED_IDS: usize = 4_096;

#[derive(Debug)]
struct Entry {
    count: u32,
    open: bool,
    turn_id: String,
}

/// Attempt counters per `api_request_id`.
#[derive(Debug)]
pub struct AttemptTracker {
    entries: HashMap<String, Entry>,
    /// Insertion order, for evicting the oldest id. Holds exactly the keys of
    /// `entries`.
    order: VecDeque<String>,
    cap: usize,
}

impl Default for AttemptTracker {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_TRACKED_IDS)
    }
}

impl AttemptTracker {
    /// A tracker keeping at most `cap` ids (at least 1).
    pub fn new(cap: usize) -> Self {
        AttemptTracker {
            entries: HashMap::new(),
            order: VecDeque::new(),
            cap: cap.max(1),
        }
    }

    /// Number of tracked ids.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no id is tracked.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn entry(&mut self, api_request_id: &str, turn_id: &str) -> &mut Entry {
        if !self.entries.contains_key(api_request_id) {
            while self.entries.len() >= self.cap {
                match self.order.pop_front() {
                    Some(oldest) => {
                        self.entries.remove(&oldest);
                    }
                    None => break,
                }
            }
            self.order.push_back(api_request_id.to_owned());
        }
        let entry = self
            .entries
            .entry(api_request_id.to_owned())
            .or_insert_with(|| Entry {
                count: 0,
                open: false,
                turn_id: String::new(),
            });
        if entry.turn_id.is_empty() && !turn_id.is_empty() {
            entry.turn_id = turn_id.to_owned();
        }
        entry
    }

    /// A `pre_api_request`: opens and returns the next attempt.
    pub fn open(&mut self, api_request_id: &str, turn_id: &str) -> u32 {
        let entry = self.entry(api_request_id, turn_id);
        entry.count = entry.count.saturating_add(1);
        entry.open = true;
        entry.count
    }

    /// A `post_api_request` or `api_request_error`: closes the open attempt
    /// and returns its number, or counts a new attempt if none is open.
    pub fn close(&mut self, api_request_id: &str, turn_id: &str) -> u32 {
        let entry = self.entry(api_request_id, turn_id);
        if entry.open {
            entry.open = false;
        } else {
            entry.count = entry.count.saturating_add(1);
        }
        entry.count
    }

    /// The turn `turn_id` ended: forget its ids.
    pub fn end_turn(&mut self, turn_id: &str) {
        if turn_id.is_empty() {
            return;
        }
        let before = self.entries.len();
        self.entries.retain(|_, e| e.turn_id != turn_id);
        if self.entries.len() != before {
            let entries = &self.entries;
            self.order.retain(|k| entries.contains_key(k));
        }
    }

    /// Sets `attempt` on API events and forgets ids of ended turns.
    pub fn stamp(&mut self, event: &mut Event) {
        let (api_id, turn_id) = match &event.ids {
            Some(ids) => (ids.api_request_id.as_str(), ids.turn_id.as_str()),
            None => ("", ""),
        };
        match event.hook.as_str() {
            hooks::PRE_API_REQUEST | hooks::POST_API_REQUEST | hooks::API_REQUEST_ERROR => {
                if api_id.is_empty() {
                    return;
                }
                let (api_id, turn_id) = (api_id.to_owned(), turn_id.to_owned());
                let attempt = if event.hook == hooks::PRE_API_REQUEST {
                    self.open(&api_id, &turn_id)
                } else {
                    self.close(&api_id, &turn_id)
                };
                if let Some(Body::Api(api)) = event.body.as_mut() {
                    api.attempt = attempt;
                }
            }
            hooks::POST_LLM_CALL | hooks::ON_SESSION_END => {
                let turn_id = turn_id.to_owned();
                self.end_turn(&turn_id);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `pre_api_request` opens an attempt; `post_api_request` and
    /// `api_request_error` end one.
    #[derive(Clone, Copy)]
    enum Call {
        Pre,
        End,
    }
    use Call::{End, Pre};

    /// The attempt numbers request `id` of turn `t` gets for `calls`.
    fn attempts(t: &mut AttemptTracker, id: &str, calls: &[Call]) -> Vec<u32> {
        calls
            .iter()
            .map(|call| match call {
                Pre => t.open(id, "t"),
                End => t.close(id, "t"),
            })
            .collect()
    }

    #[test]
    fn retry_sequence() {
        let mut t = AttemptTracker::default();
        // pre, error(500), pre, post.
        assert_eq!(attempts(&mut t, "a", &[Pre, End, Pre, End]), [1, 1, 2, 2]);
        // Another id starts at 1.
        assert_eq!(attempts(&mut t, "b", &[Pre, End]), [1, 1]);
        t.end_turn("t");
        assert!(t.is_empty());
    }

    #[test]
    fn lean_mode_without_pre() {
        let mut t = AttemptTracker::default();
        assert_eq!(attempts(&mut t, "a", &[End, End, End]), [1, 2, 3]);
    }

    #[test]
    fn end_turn_only_forgets_that_turn() {
        let mut t = AttemptTracker::default();
        t.open("a", "t1");
        t.open("b", "t2");
        t.end_turn("t1");
        assert_eq!(t.len(), 1);
        assert_eq!(t.close("b", "t2"), 1);
        assert_eq!(t.open("a", "t1"), 1, "a was forgotten");
    }

    #[test]
    fn bounded() {
        let mut t = AttemptTracker::new(3);
        for i in 0..10 {
            t.open(&format!("id{i}"), "");
        }
        assert_eq!(t.len(), 3);
        assert_eq!(t.order.len(), 3);
        // The newest survive.
        assert_eq!(t.close("id9", ""), 1);
        assert_eq!(t.open("id0", ""), 1);
    }
}
