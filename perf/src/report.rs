//! Turning results into a human summary or one JSON object.

use serde_json::{json, Value};

use crate::idle::IdleResult;
use crate::run::RunResult;
use crate::topology::ExchangeKind;

fn rate(n: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        n as f64 / secs
    } else {
        0.0
    }
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// Rates between consecutive progress marks: (published up to, msg/s over that interval).
fn interval_rates(marks: &[(u64, f64)]) -> Vec<(u64, f64)> {
    let mut prev = (0u64, 0.0f64);
    marks
        .iter()
        .map(|&(n, t)| {
            let r = rate(n - prev.0, t - prev.1);
            prev = (n, t);
            (n, r)
        })
        .collect()
}

impl RunResult {
    pub fn published_rate(&self) -> f64 {
        rate(self.published, self.publish_secs)
    }

    pub fn confirmed_rate(&self) -> f64 {
        rate(self.confirmed, self.publish_secs)
    }

    pub fn consumed_rate(&self) -> f64 {
        rate(self.consumed, self.consume_secs)
    }

    pub fn cpu_percent(&self) -> f64 {
        if self.wall_secs > 0.0 {
            self.cpu_us as f64 / 1e4 / self.wall_secs
        } else {
            0.0
        }
    }

    /// Client CPU per message: the larger of published and consumed counts as the message count.
    pub fn cpu_us_per_msg(&self) -> f64 {
        let n = self.published.max(self.consumed);
        if n == 0 {
            0.0
        } else {
            self.cpu_us as f64 / n as f64
        }
    }

    /// Client CPU per operation, publishes and deliveries counted separately.
    pub fn cpu_us_per_op(&self) -> f64 {
        let n = self.published + self.consumed;
        if n == 0 {
            0.0
        } else {
            self.cpu_us as f64 / n as f64
        }
    }

    pub fn to_json(&self) -> Value {
        let rates = interval_rates(&self.progress);
        let mut v = json!({
            "mode": "load",
            "producers": self.producers,
            "consumers": self.consumers,
            "queues": self.queues,
            "size": self.size,
            "exchange_type": self.kind.as_str(),
            "persistent": self.persistent,
            "confirm": self.confirm,
            "autoack": self.autoack,
            "rate_limit": self.rate_limit,
            "queued_at_start": self.queued_at_start,
            "published": self.published,
            "published_rate": self.published_rate(),
            "confirmed": self.confirmed,
            "confirmed_rate": self.confirmed_rate(),
            "nacked": self.nacked,
            "consumed": self.consumed,
            "consumed_rate": self.consumed_rate(),
            "publish_secs": self.publish_secs,
            "consume_secs": self.consume_secs,
            "wall_secs": self.wall_secs,
            "latency_samples": self.latency.count(),
            "latency_min_ms": ms(self.latency.min()),
            "latency_mean_ms": self.latency.mean() / 1e6,
            "latency_p50_ms": ms(self.latency.quantile(0.5)),
            "latency_p99_ms": ms(self.latency.quantile(0.99)),
            "latency_p999_ms": ms(self.latency.quantile(0.999)),
            "latency_max_ms": ms(self.latency.max()),
            "client_cpu_us": self.cpu_us,
            "client_cpu_percent": self.cpu_percent(),
            "client_cpu_us_per_msg": self.cpu_us_per_msg(),
            "client_cpu_us_per_op": self.cpu_us_per_op(),
            "publish_marks": self.progress.iter().map(|&(n, t)| json!([n, t])).collect::<Vec<_>>(),
            "publish_rate_first_interval": rates.first().map(|r| r.1),
            "publish_rate_last_interval": rates.last().map(|r| r.1),
            "blocked": self.blocked,
            "errors": self.errors,
        });
        // A second object: one json! this size would pass the macro recursion limit.
        let delayed = json!({
            "delay": self.delay.map(|r| json!([r.min, r.max])),
            "ttl": self.ttl.map(|r| json!([r.min, r.max])),
            "lateness_samples": self.lateness.count(),
            "lateness_mean_ms": self.lateness.mean() / 1e6,
            "lateness_p50_ms": ms(self.lateness.quantile(0.5)),
            "lateness_p99_ms": ms(self.lateness.quantile(0.99)),
            "lateness_p999_ms": ms(self.lateness.quantile(0.999)),
            "lateness_max_ms": ms(self.lateness.max()),
            "early": self.early,
            "early_max_ms": ms(self.early_max_ns),
        });
        if let (Value::Object(all), Value::Object(more)) = (&mut v, delayed) {
            all.extend(more);
        }
        v
    }

    pub fn to_text(&self) -> String {
        let mut s = format!(
            "warren-perf: {} producer(s), {} consumer(s), {} queue(s) ({}), {} B{}{}{}{}{}{}\n",
            self.producers,
            self.consumers,
            self.queues,
            self.kind.as_str(),
            self.size,
            if self.persistent { ", persistent" } else { "" },
            if self.confirm > 0 {
                format!(", confirm window {}", self.confirm)
            } else {
                String::new()
            },
            if self.consumers > 0 {
                if self.autoack {
                    ", autoack"
                } else {
                    ", manual ack"
                }
            } else {
                ""
            },
            if self.rate_limit > 0.0 {
                format!(", {} msg/s per producer", self.rate_limit)
            } else {
                String::new()
            },
            self.delay
                .map(|r| format!(", x-delay {r}"))
                .unwrap_or_default(),
            self.ttl.map(|r| format!(", ttl {r}")).unwrap_or_default(),
        );
        if self.queued_at_start > 0 {
            s += &format!("  already queued: {} messages\n", self.queued_at_start);
        }
        if self.producers > 0 {
            s += &format!(
                "  published: {:>10.0} msg/s  ({} in {:.2} s)\n",
                self.published_rate(),
                self.published,
                self.publish_secs
            );
            if self.confirm > 0 {
                s += &format!(
                    "  confirmed: {:>10.0} msg/s  ({} confirmed, {} nacked)\n",
                    self.confirmed_rate(),
                    self.confirmed,
                    self.nacked
                );
            }
            for (n, r) in interval_rates(&self.progress) {
                s += &format!("    published up to {n:>10}: {r:>10.0} msg/s\n");
            }
        }
        if self.consumers > 0 {
            let what = if self.kind == ExchangeKind::Fanout {
                "deliveries"
            } else {
                "consumed "
            };
            s += &format!(
                "  {what}: {:>10.0} msg/s  ({} in {:.2} s)\n",
                self.consumed_rate(),
                self.consumed,
                self.consume_secs
            );
            if self.latency.count() > 0 {
                s += &format!(
                    "  latency:   p50 {:.3} ms  p99 {:.3} ms  p99.9 {:.3} ms  max {:.3} ms  ({} samples)\n",
                    ms(self.latency.quantile(0.5)),
                    ms(self.latency.quantile(0.99)),
                    ms(self.latency.quantile(0.999)),
                    ms(self.latency.max()),
                    self.latency.count()
                );
            }
            if self.lateness.count() > 0 {
                s += &format!(
                    "  lateness:  p50 {:.3} ms  p99 {:.3} ms  p99.9 {:.3} ms  max {:.3} ms  ({} samples; receive - (publish + x-delay))\n",
                    ms(self.lateness.quantile(0.5)),
                    ms(self.lateness.quantile(0.99)),
                    ms(self.lateness.quantile(0.999)),
                    ms(self.lateness.max()),
                    self.lateness.count()
                );
                if self.early > 0 {
                    s += &format!(
                        "  early:     {} delivered before their delay had passed (by up to {:.3} ms), counted as 0\n",
                        self.early,
                        ms(self.early_max_ns)
                    );
                }
            }
        }
        s += &format!(
            "  client CPU: {:.1}% of one core, {:.2} us/msg ({:.2} us per publish or delivery)\n",
            self.cpu_percent(),
            self.cpu_us_per_msg(),
            self.cpu_us_per_op()
        );
        if self.cpu_percent() > 90.0 {
            s += "  note: the client used most of its core; the broker may not be the bottleneck\n";
        }
        if self.blocked > 0 {
            s += &format!("  the broker blocked publishers {} time(s)\n", self.blocked);
        }
        for e in &self.errors {
            s += &format!("  error: {e}\n");
        }
        s
    }
}

impl IdleResult {
    pub fn to_json(&self) -> Value {
        json!({
            "mode": "idle",
            "connections": self.connections,
            "open_secs": self.open_secs,
            "connections_per_sec": rate(self.connections as u64, self.open_secs),
            "hold_secs": self.hold_secs,
            "client_cpu_us": self.cpu_us,
            "errors": self.errors,
        })
    }

    pub fn to_text(&self) -> String {
        let mut s = format!(
            "warren-perf: {} idle connections, each consuming from its own queue\n  opened in {:.2} s ({:.0}/s), held {:.1} s, client CPU {:.2} s\n",
            self.connections,
            self.open_secs,
            rate(self.connections as u64, self.open_secs),
            self.hold_secs,
            self.cpu_us as f64 / 1e6
        );
        for e in &self.errors {
            s += &format!("  error: {e}\n");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_rates_use_the_previous_mark() {
        let r = interval_rates(&[(100, 1.0), (200, 3.0)]);
        assert_eq!(r, vec![(100, 100.0), (200, 50.0)]);
    }
}
