//! The `samples` RabbitMQ's API adds to a `*_details` object when asked
//! with `lengths_age` / `lengths_incr` (depths) and `msg_rates_age` /
//! `msg_rates_incr` (message counters, as running totals): newest first,
//! `[{"sample", "timestamp"}]`, the last ten minutes at most.

use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::history::Sample;

/// The query parameters that ask for samples (seconds).
#[derive(Debug, Default, Deserialize)]
pub struct SampleQuery {
    pub lengths_age: Option<u64>,
    pub lengths_incr: Option<u64>,
    pub msg_rates_age: Option<u64>,
    pub msg_rates_incr: Option<u64>,
}

impl SampleQuery {
    /// Whether any samples are asked for.
    pub fn wanted(&self) -> bool {
        self.lengths_age.is_some() || self.msg_rates_age.is_some()
    }

    /// The widest (age, incr) asked for, in ms, to select once.
    pub fn window(&self) -> (u64, u64) {
        let age = self.lengths_age.max(self.msg_rates_age).unwrap_or(0);
        let incr = match (self.lengths_incr, self.msg_rates_incr) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).unwrap_or(5),
        };
        let keep = crate::history::KEEP_MS;
        (
            age.saturating_mul(1000).min(keep),
            incr.max(1).saturating_mul(1000).min(keep),
        )
    }
}

/// Adds the samples of `history` (values named by `names`: the first
/// `depths` go into `depth_into`, the rest into `rates_into`, as
/// `<name>_details.samples`).
pub fn add<const N: usize>(
    q: &SampleQuery,
    history: &[Sample<N>],
    names: &[&str; N],
    depths: usize,
    depth_into: &mut Map<String, Value>,
    rates_into: &mut Map<String, Value>,
) {
    let now = crate::util::now_ms();
    for (i, name) in names.iter().enumerate() {
        let (age, into) = if i < depths {
            (q.lengths_age, &mut *depth_into)
        } else {
            (q.msg_rates_age, &mut *rates_into)
        };
        let Some(age) = age else { continue };
        let from = now.saturating_sub(age.saturating_mul(1000));
        let samples: Vec<Value> = history
            .iter()
            .filter(|s| s.0 >= from)
            .map(|s| json!({"sample": s.1[i], "timestamp": s.0}))
            .collect();
        let details = into
            .entry(format!("{name}_details"))
            .or_insert_with(|| json!({"rate": 0.0}));
        if let Value::Object(d) = details {
            d.insert("samples".into(), Value::Array(samples));
        }
    }
}
