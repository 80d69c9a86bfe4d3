//! Model-based tests: random operations against the queue and a plain
//! in-memory model, reopening the database in between.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

#[derive(Debug, Clone)]
enum Op {
    Append(Vec<Vec<u8>>, bool),
    /// Marker over the last `n` lsns appended, then truncate below
    /// `next_lsn - keep`.
    Settle {
        keep: u64,
        marker_keys: u8,
    },
    Sync,
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 1..5), any::<bool>())
            .prop_map(|(r, d)| Op::Append(r, d)),
        2 => (0u64..8, 0u8..3).prop_map(|(keep, marker_keys)| Op::Settle { keep, marker_keys }),
        1 => Just(Op::Sync),
        1 => Just(Op::Reopen),
    ]
}

#[derive(Default)]
struct Model {
    records: BTreeMap<u64, Vec<u8>>,
    /// (last_lsn, keys)
    markers: Vec<(u64, Vec<u8>)>,
    next_lsn: u64,
}

impl Model {
    fn bytes(&self) -> u64 {
        self.records.values().map(|r| r.len() as u64).sum::<u64>()
            + self
                .markers
                .iter()
                .map(|(_, k)| k.len() as u64)
                .sum::<u64>()
    }
}

fn key(n: u64) -> Vec<u8> {
    let mut k = vec![0u8; SPAN_KEY_BYTES];
    k[..8].copy_from_slice(&n.to_be_bytes());
    k
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn queue_matches_the_model(ops in proptest::collection::vec(op(), 1..40)) {
        let dir = tempfile::tempdir().unwrap();
        let mut queue = DiskQueue::open(dir.path()).unwrap();
        let mut model = Model { next_lsn: 1, ..Model::default() };
        let mut marker_n = 0u64;
        for op in ops {
            match op {
                Op::Append(records, durable) => {
                    let first = queue.append(&records, &[], 0, durable).unwrap();
                    prop_assert_eq!(first, model.next_lsn);
                    for r in records {
                        model.records.insert(model.next_lsn, r);
                        model.next_lsn += 1;
                    }
                }
                Op::Settle { keep, marker_keys } => {
                    let below = model.next_lsn.saturating_sub(keep);
                    let last = model.next_lsn.saturating_sub(1);
                    let keys: Vec<u8> = (0..marker_keys)
                        .flat_map(|_| { marker_n += 1; key(marker_n) })
                        .collect();
                    queue.settle(&[(last, keys.clone())], below, 0, false).unwrap();
                    if last >= below && !keys.is_empty() {
                        model.markers.push((last, keys));
                    }
                    model.records.retain(|lsn, _| *lsn >= below);
                    model.markers.retain(|(l, _)| *l >= below);
                }
                Op::Sync => queue.sync().unwrap(),
                Op::Reopen => {
                    // A clean close makes every commit durable (redb
                    // persists non-durable commits on drop).
                    drop(queue);
                    queue = DiskQueue::open(dir.path()).unwrap();
                }
            }
            prop_assert_eq!(queue.len(), model.records.len() as u64);
            prop_assert_eq!(queue.bytes(), model.bytes());
            prop_assert_eq!(queue.next_lsn(), model.next_lsn);
            let stored = queue.read_from(0, usize::MAX).unwrap();
            let expected: Vec<(u64, Vec<u8>)> =
                model.records.iter().map(|(l, r)| (*l, r.clone())).collect();
            prop_assert_eq!(stored, expected);
            let exported = queue.exported().unwrap();
            let expected: HashSet<SpanKey> = model
                .markers
                .iter()
                .flat_map(|(_, k)| k.chunks_exact(SPAN_KEY_BYTES).map(|c| SpanKey::try_from(c).unwrap()))
                .collect();
            prop_assert_eq!(exported, expected);
        }
    }
}

#[test]
fn read_from_pages_in_lsn_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = DiskQueue::open(dir.path()).unwrap();
    let records: Vec<Vec<u8>> = (0u8..10).map(|i| vec![i; 3]).collect();
    assert_eq!(queue.append(&records, &[], 0, true).unwrap(), 1);
    let page = queue.read_from(4, 3).unwrap();
    assert_eq!(
        page.iter().map(|(l, _)| *l).collect::<Vec<_>>(),
        vec![4, 5, 6]
    );
    assert_eq!(page[0].1, vec![3u8; 3]);
    assert_eq!(queue.first_lsn().unwrap(), Some(1));
    queue.settle(&[], 8, 0, true).unwrap();
    assert_eq!(queue.first_lsn().unwrap(), Some(8));
}

#[test]
fn lsns_are_never_reused_after_everything_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = DiskQueue::open(dir.path()).unwrap();
    queue.append(&[b"a", b"b"], &[], 0, true).unwrap();
    queue.settle(&[(2, key(1))], 3, 0, true).unwrap();
    assert!(queue.is_empty());
    drop(queue);
    let mut queue = DiskQueue::open(dir.path()).unwrap();
    assert_eq!(queue.next_lsn(), 3);
    assert_eq!(queue.append(&[b"c"], &[], 0, true).unwrap(), 3);
}

#[test]
fn a_file_that_is_not_a_queue_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(FILE_NAME), b"not a database at all").unwrap();
    let err = DiskQueue::open(dir.path()).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("cannot open the persistent queue"), "{text}");
    assert!(text.contains(FILE_NAME), "{text}");
}

#[test]
fn highest_persisted_seqs_survive_their_records_and_expire() {
    let dir = tempfile::tempdir().unwrap();
    let mut queue = DiskQueue::open(dir.path()).unwrap();
    queue
        .append(&[b"a"], &[("i-1", 10), ("i-2", 3)], 100, true)
        .unwrap();
    queue.append(&[b"b"], &[("i-1", 7)], 200, true).unwrap();
    // Every record deleted: the seqs stay.
    queue.settle(&[], 3, 300, true).unwrap();
    assert!(queue.is_empty());
    drop(queue);
    let mut queue = DiskQueue::open(dir.path()).unwrap();
    let seqs = queue.seqs().unwrap();
    assert_eq!(seqs.get("i-1"), Some(&10), "the highest, not the latest");
    assert_eq!(seqs.get("i-2"), Some(&3));
    // i-2 was last seen at 100, i-1 at 200.
    queue.settle(&[], 3, 150 + SEQS_TTL_SECS, true).unwrap();
    let seqs = queue.seqs().unwrap();
    assert_eq!(seqs.len(), 1);
    assert!(seqs.contains_key("i-1"));
}
