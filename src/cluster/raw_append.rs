//! An append whose batches travel raw (rpc.rs `APPEND_RAW`): neither side
//! copies a batch through bincode. The leader writes the request's head
//! and then each batch from the buffer the log holds; the follower cuts
//! each batch out of the frame it read, without a copy.
//!
//! The body: the head's length (u32, big-endian), the head (the bincode
//! of the request with every batch emptied, and each batch's length in
//! order), then the batches.

use bytes::Bytes;
use openraft::raft::AppendEntriesRequest;
use openraft::EntryPayload;
use serde::{Deserialize, Serialize};

use crate::store::raft::TypeConfig;

#[derive(Serialize, Deserialize)]
struct Head {
    request: AppendEntriesRequest<TypeConfig>,
    lens: Vec<u64>,
}

/// `rpc` as the parts of a raw append's body: the head, then the batches.
pub fn encode(mut rpc: AppendEntriesRequest<TypeConfig>) -> Result<Vec<Bytes>, String> {
    let mut batches = Vec::new();
    for e in &mut rpc.entries {
        if let EntryPayload::Normal(batch) = &mut e.payload {
            batches.push(std::mem::take(&mut batch.0));
        }
    }
    let lens = batches.iter().map(|b| b.len() as u64).collect();
    let head = bincode::serialize(&Head { request: rpc, lens }).map_err(|e| e.to_string())?;
    let head_len = u32::try_from(head.len()).map_err(|_| "an append's head over 4 GiB")?;
    let mut first = Vec::with_capacity(4 + head.len());
    first.extend_from_slice(&head_len.to_be_bytes());
    first.extend_from_slice(&head);
    let mut parts = Vec::with_capacity(1 + batches.len());
    parts.push(Bytes::from(first));
    parts.extend(batches);
    Ok(parts)
}

/// The request a raw append's `body` carries, its batches slices of it.
pub fn decode(body: Bytes) -> Result<AppendEntriesRequest<TypeConfig>, String> {
    let head_len = body
        .get(..4)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map(u32::from_be_bytes)
        .ok_or("a raw append without its head's length")?;
    let head_end = usize::try_from(head_len)
        .ok()
        .and_then(|n| n.checked_add(4))
        .filter(|&end| end <= body.len())
        .ok_or("a raw append's head past its end")?;
    let Head { mut request, lens } =
        bincode::deserialize(&body[4..head_end]).map_err(|e| e.to_string())?;
    let mut lens = lens.into_iter();
    let mut at = head_end;
    for e in &mut request.entries {
        if let EntryPayload::Normal(batch) = &mut e.payload {
            let end = lens
                .next()
                .and_then(|len| usize::try_from(len).ok())
                .and_then(|len| at.checked_add(len))
                .filter(|&end| end <= body.len())
                .ok_or("a raw append's batch past its end")?;
            batch.0 = body.slice(at..end);
            at = end;
        }
    }
    if lens.next().is_some() || at != body.len() {
        return Err("a raw append whose batches do not fill it".into());
    }
    Ok(request)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::raft::Batch;
    use openraft::{CommittedLeaderId, Entry, LogId, Vote};

    fn entry(index: u64, payload: EntryPayload<TypeConfig>) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(2, 1), index),
            payload,
        }
    }

    fn request() -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: Vote::new_committed(2, 1),
            prev_log_id: Some(LogId::new(CommittedLeaderId::new(2, 1), 6)),
            leader_commit: Some(LogId::new(CommittedLeaderId::new(2, 1), 5)),
            entries: vec![
                entry(
                    7,
                    EntryPayload::Normal(Batch(Bytes::from_static(b"first batch"))),
                ),
                entry(8, EntryPayload::Blank),
                entry(9, EntryPayload::Normal(Batch(Bytes::new()))),
                entry(
                    10,
                    EntryPayload::Normal(Batch(Bytes::from(vec![7u8; 3000]))),
                ),
            ],
        }
    }

    fn body(parts: &[Bytes]) -> Bytes {
        Bytes::from(parts.concat())
    }

    #[test]
    fn a_request_comes_back_as_it_went() {
        let sent = request();
        let parts = encode(sent.clone()).unwrap();
        assert_eq!(parts.len(), 4, "the head, then one part a batch");
        let got = decode(body(&parts)).unwrap();
        assert_eq!(
            bincode::serialize(&got).unwrap(),
            bincode::serialize(&sent).unwrap()
        );
    }

    #[test]
    fn a_heartbeat_is_its_head_alone() {
        let mut sent = request();
        sent.entries.clear();
        let parts = encode(sent.clone()).unwrap();
        assert_eq!(parts.len(), 1);
        let got = decode(body(&parts)).unwrap();
        assert!(got.entries.is_empty());
        assert_eq!(got.prev_log_id, sent.prev_log_id);
    }

    #[test]
    fn a_body_cut_short_or_too_long_is_refused() {
        let whole = body(&encode(request()).unwrap());
        for cut in [0, 3, 4, 20, whole.len() - 1] {
            assert!(decode(whole.slice(..cut)).is_err(), "cut at {cut}");
        }
        let mut longer = whole.to_vec();
        longer.push(0);
        assert!(decode(Bytes::from(longer)).is_err());
        let mut huge_head = whole.to_vec();
        huge_head[..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(decode(Bytes::from(huge_head)).is_err());
    }
}
