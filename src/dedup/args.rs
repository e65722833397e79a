//! The deduplication arguments of an exchange or a queue (LavinMQ's
//! names, which the community RabbitMQ plugin shares):
//! `x-message-deduplication` (true turns it on), `x-cache-size` (entries
//! kept, 128 by default), `x-cache-ttl` (ms an entry is kept, none by
//! default: until the size pushes it out) and `x-deduplication-header`
//! (the header that carries a message's key, `x-deduplication-header` by
//! default).

use amq_protocol::types::{AMQPValue, FieldTable};

use crate::wire::type_name;
use crate::wire::value::{int, text};

/// The header a message's key is read from when no other is named.
pub const DEFAULT_HEADER: &str = "x-deduplication-header";

/// Entries a cache keeps when `x-cache-size` is not given (LavinMQ's).
pub const DEFAULT_SIZE: u64 = 128;

/// The largest `x-cache-size` taken: under 100 bytes of memory an entry
/// (ring.rs), so under 1 GB for one cache.
pub const MAX_SIZE: u64 = 10_000_000;

/// The deduplication settings in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DedupArgs {
    /// Entries kept (the oldest go first).
    pub size: u64,
    /// How long an entry is kept, ms (None: until the size pushes it out);
    /// a message's own `x-cache-ttl` header wins.
    pub ttl_ms: Option<u64>,
    /// The header that carries a message's key.
    pub header: String,
}

const KEYS: [&str; 4] = [
    "x-message-deduplication",
    "x-cache-size",
    "x-cache-ttl",
    "x-deduplication-header",
];

/// The settings `args` turn on, if they do (see `validate`).
pub fn of(args: &FieldTable) -> Option<DedupArgs> {
    let get = |k: &str| args.inner().get(k);
    if !matches!(get(KEYS[0]), Some(AMQPValue::Boolean(true))) {
        return None;
    }
    let uint = |k: &str| get(k).and_then(int).and_then(|n| u64::try_from(n).ok());
    Some(DedupArgs {
        size: uint(KEYS[1]).unwrap_or(DEFAULT_SIZE),
        ttl_ms: uint(KEYS[2]),
        header: get(KEYS[3])
            .and_then(text)
            .unwrap_or_else(|| DEFAULT_HEADER.to_string()),
    })
}

/// Checks the deduplication arguments of `subject` ("exchange 'x' in
/// vhost '/'"): the reply text of a 406 if they are wrong. A cache
/// setting without `x-message-deduplication` set to true is refused:
/// nothing would act on it.
pub fn validate(args: &FieldTable, subject: &str) -> Result<(), String> {
    let get = |k: &str| args.inner().get(k);
    let bad = |k: &str, why: String| Err(format!("invalid arg '{k}' for {subject}: {why}"));
    let on = match get(KEYS[0]) {
        None => false,
        Some(AMQPValue::Boolean(b)) => *b,
        Some(v) => return bad(KEYS[0], format!("expected a boolean, got {}", type_name(v))),
    };
    for k in &KEYS[1..] {
        if get(k).is_some() && !on {
            return bad(
                k,
                "it applies only with x-message-deduplication set to true".into(),
            );
        }
    }
    for k in &KEYS[1..3] {
        let Some(v) = get(k) else { continue };
        match int(v) {
            None => return bad(k, format!("expected an integer, got {}", type_name(v))),
            Some(n) if n <= 0 => return bad(k, format!("{n} is not a positive integer")),
            Some(n) if *k == KEYS[1] && n as u64 > MAX_SIZE => {
                return bad(k, format!("{n} is above the largest cache, {MAX_SIZE}"))
            }
            Some(_) => {}
        }
    }
    if let Some(v) = get(KEYS[3]) {
        match text(v) {
            Some(h) if !h.is_empty() && h.len() <= 255 => {}
            Some(_) => return bad(KEYS[3], "a header name is 1 to 255 bytes".into()),
            None => return bad(KEYS[3], format!("expected a string, got {}", type_name(v))),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(kv: &[(&str, AMQPValue)]) -> FieldTable {
        let mut t = FieldTable::default();
        for (k, v) in kv {
            t.insert((*k).into(), v.clone());
        }
        t
    }

    #[test]
    fn defaults_and_given_values() {
        assert_eq!(of(&table(&[])), None);
        let on = table(&[(KEYS[0], AMQPValue::Boolean(true))]);
        assert_eq!(
            of(&on),
            Some(DedupArgs {
                size: DEFAULT_SIZE,
                ttl_ms: None,
                header: DEFAULT_HEADER.into()
            })
        );
        let t = table(&[
            (KEYS[0], AMQPValue::Boolean(true)),
            (KEYS[1], AMQPValue::ShortInt(5)),
            (KEYS[2], AMQPValue::LongLongInt(1000)),
            (KEYS[3], AMQPValue::LongString("id".into())),
        ]);
        assert!(validate(&t, "q").is_ok());
        assert_eq!(
            of(&t),
            Some(DedupArgs {
                size: 5,
                ttl_ms: Some(1000),
                header: "id".into()
            })
        );
    }

    #[test]
    fn what_nothing_would_act_on_and_bad_values_are_refused() {
        let off = table(&[(KEYS[1], AMQPValue::LongInt(5))]);
        assert!(validate(&off, "q").unwrap_err().contains("only with"));
        let off = table(&[
            (KEYS[0], AMQPValue::Boolean(false)),
            (KEYS[3], AMQPValue::LongString("h".into())),
        ]);
        assert!(validate(&off, "q").is_err());
        for bad in [
            (KEYS[0], AMQPValue::LongString("yes".into())),
            (KEYS[1], AMQPValue::LongInt(0)),
            (KEYS[1], AMQPValue::LongLongInt(MAX_SIZE as i64 + 1)),
            (KEYS[2], AMQPValue::LongInt(-1)),
            (KEYS[2], AMQPValue::LongString("1s".into())),
            (KEYS[3], AMQPValue::LongString("".into())),
            (KEYS[3], AMQPValue::LongInt(1)),
        ] {
            let t = table(&[(KEYS[0], AMQPValue::Boolean(true)), bad.clone()]);
            assert!(validate(&t, "q").is_err(), "{bad:?}");
        }
    }
}
