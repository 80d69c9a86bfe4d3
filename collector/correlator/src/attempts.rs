//! A turn's API requests: the attempts open under each `api_request_id`
//! and when the latest closed attempt ended.
//!
//! One map entry per request id, found by the id as a `&str`: the pre
//! event of an attempt makes the entry (the one copy of the id), the post
//! or error event closes the attempt in place, and the entry stays with
//! the end time for a next attempt whose pre event is missing. Retries of
//! one request are sequential, so the first open attempt is kept inline;
//! further ones (a shim that never closes its attempts) go to an ordered
//! map, so no lookup is linear in what an agent sends.

use std::collections::BTreeMap;

use hermes_span::Str;

use super::{Map, OpenAttempt};

/// The open attempts of one API request, and its latest end.
#[derive(Default)]
pub(crate) struct ApiRequest {
    first: Option<(u32, OpenAttempt)>,
    others: BTreeMap<u32, OpenAttempt>,
    /// End of the latest closed attempt.
    pub(crate) last_end: Option<u64>,
}

impl ApiRequest {
    /// Opens `attempt`; the attempt it replaces, if it was open.
    pub(crate) fn open(&mut self, attempt: u32, open: OpenAttempt) -> Option<OpenAttempt> {
        match &mut self.first {
            Some((n, old)) if *n == attempt => Some(std::mem::replace(old, open)),
            Some(_) => self.others.insert(attempt, open),
            None => {
                self.first = Some((attempt, open));
                None
            }
        }
    }

    /// Takes `attempt` if it is open.
    pub(crate) fn close(&mut self, attempt: u32) -> Option<OpenAttempt> {
        match &self.first {
            Some((n, _)) if *n == attempt => self.first.take().map(|(_, open)| open),
            _ => self.others.remove(&attempt),
        }
    }

    /// The numbers of the open attempts.
    fn open_attempts(&self) -> impl Iterator<Item = u32> + '_ {
        self.first
            .iter()
            .map(|(n, _)| *n)
            .chain(self.others.keys().copied())
    }
}

/// Every open attempt of `requests` as (request id, attempt), sorted.
pub(crate) fn open_attempts(requests: &Map<Str, ApiRequest>) -> Vec<(Str, u32)> {
    let mut open: Vec<(Str, u32)> = requests
        .iter()
        .flat_map(|(id, request)| request.open_attempts().map(move |n| (id.clone(), n)))
        .collect();
    open.sort();
    open
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(start: u64) -> OpenAttempt {
        OpenAttempt {
            start,
            model: Str::default(),
            provider: Str::default(),
            base_url: Str::default(),
            api_call_count: 0,
            max_tokens: None,
            input: (None, None),
        }
    }

    #[test]
    fn attempts_open_replace_and_close_by_number() {
        let mut request = ApiRequest::default();
        assert!(request.open(1, attempt(10)).is_none());
        assert!(request.open(3, attempt(30)).is_none());
        assert!(request.open(2, attempt(20)).is_none());
        assert_eq!(request.open(3, attempt(31)).map(|a| a.start), Some(30));
        assert_eq!(request.open(1, attempt(11)).map(|a| a.start), Some(10));
        assert_eq!(request.open_attempts().collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(request.close(2).map(|a| a.start), Some(20));
        assert!(request.close(2).is_none());
        assert_eq!(request.close(1).map(|a| a.start), Some(11));
        assert!(request.open(4, attempt(40)).is_none());
        assert_eq!(request.open_attempts().collect::<Vec<_>>(), [4, 3]);
        let mut requests = Map::default();
        requests.insert(Str::from("b"), request);
        let mut a = ApiRequest::default();
        a.open(7, attempt(70));
        requests.insert(Str::from("a"), a);
        assert_eq!(
            open_attempts(&requests),
            [
                (Str::from("a"), 7),
                (Str::from("b"), 3),
                (Str::from("b"), 4)
            ]
        );
    }
}
