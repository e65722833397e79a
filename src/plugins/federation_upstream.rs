//! The `x-federation-upstream` exchange type (RabbitMQ's federation
//! plugin's): what a downstream's federation link declares on its
//! upstream, with its upstream queue bound to it. It routes like fanout,
//! but only a message that may still travel to that downstream: fewer
//! `x-received-from` entries than its `x-max-hops`, and none naming the
//! downstream's cluster and vhost (the message came from there). The same
//! test is what a link applies to what it receives (crate::federation).

use warren_plugin_api::value::{int, text};
use warren_plugin_api::{
    AMQPValue, DestId, ExchangeType, FieldTable, MessageView, RoutingTable, Table,
};

/// The exchange type.
pub struct FederationUpstream;

/// The header a federation link prepends a table to.
pub const RECEIVED_FROM: &str = "x-received-from";

/// Whether a message with `headers` may go on to the downstream
/// `cluster`/`vhost` when links allow `max_hops` hops.
pub fn may_forward(
    headers: Option<&FieldTable>,
    max_hops: u64,
    cluster: &str,
    vhost: &str,
) -> bool {
    let Some(AMQPValue::FieldArray(hops)) = headers.and_then(|h| h.inner().get(RECEIVED_FROM))
    else {
        return true;
    };
    let hops = hops.as_slice();
    if hops.len() as u64 >= max_hops {
        return false;
    }
    !hops.iter().any(|h| match h {
        AMQPValue::FieldTable(t) => {
            let field = |k: &str| t.inner().get(k).and_then(text);
            field("cluster-name").as_deref() == Some(cluster)
                && field("vhost").as_deref() == Some(vhost)
        }
        _ => false,
    })
}

impl ExchangeType for FederationUpstream {
    fn name(&self) -> &'static str {
        "x-federation-upstream"
    }

    fn validate(&self, arguments: &FieldTable) -> Result<(), String> {
        match arguments.inner().get("x-max-hops") {
            None => Err("Argument x-max-hops missing".into()),
            Some(v) if int(v).is_some_and(|n| n >= 0) => Ok(()),
            Some(_) => Err("Argument x-max-hops must be of type long".into()),
        }
    }

    fn new_table(&self, arguments: &FieldTable) -> Table {
        let get = |k: &str| arguments.inner().get(k);
        Table::Custom(Box::new(Hops {
            max_hops: get("x-max-hops").and_then(int).unwrap_or(1).max(0) as u64,
            cluster: get("x-downstream-name").and_then(text).unwrap_or_default(),
            vhost: get("x-downstream-vhost").and_then(text).unwrap_or_default(),
            bindings: Vec::new(),
        }))
    }
}

/// An exchange's bindings (fanout's: the key plays no part) and the
/// downstream it serves.
struct Hops {
    max_hops: u64,
    cluster: String,
    vhost: String,
    bindings: Vec<(String, FieldTable, DestId)>,
}

impl RoutingTable for Hops {
    fn bind(&mut self, key: &str, arguments: &FieldTable, dest: DestId) -> Result<bool, String> {
        if self
            .bindings
            .iter()
            .any(|(k, a, d)| k == key && a == arguments && *d == dest)
        {
            return Ok(false);
        }
        self.bindings
            .push((key.to_string(), arguments.clone(), dest));
        Ok(true)
    }

    fn unbind(&mut self, key: &str, arguments: &FieldTable, dest: DestId) -> bool {
        let before = self.bindings.len();
        self.bindings
            .retain(|(k, a, d)| !(k == key && a == arguments && *d == dest));
        self.bindings.len() != before
    }

    fn unbind_all(&mut self, dest: DestId) -> usize {
        let before = self.bindings.len();
        self.bindings.retain(|(_, _, d)| *d != dest);
        before - self.bindings.len()
    }

    fn route(&self, msg: &MessageView<'_>, out: &mut Vec<DestId>) {
        if !may_forward(msg.headers, self.max_hops, &self.cluster, &self.vhost) {
            return;
        }
        for (_, _, d) in &self.bindings {
            if !out.contains(d) {
                out.push(*d);
            }
        }
    }

    fn bindings(&self) -> Vec<(String, FieldTable, DestId)> {
        self.bindings.clone()
    }

    fn len(&self) -> usize {
        self.bindings.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use amq_protocol::types::{FieldArray, LongString};

    fn hop(cluster: &str, vhost: &str) -> AMQPValue {
        let mut t = FieldTable::default();
        t.insert(
            "cluster-name".into(),
            AMQPValue::LongString(LongString::from(cluster)),
        );
        t.insert(
            "vhost".into(),
            AMQPValue::LongString(LongString::from(vhost)),
        );
        AMQPValue::FieldTable(t)
    }

    fn headers(hops: Vec<AMQPValue>) -> FieldTable {
        let mut h = FieldTable::default();
        h.insert(
            RECEIVED_FROM.into(),
            AMQPValue::FieldArray(FieldArray::from(hops)),
        );
        h
    }

    #[test]
    fn hops_and_loops_stop_a_message() {
        assert!(may_forward(None, 1, "b", "/"));
        assert!(!may_forward(
            Some(&headers(vec![hop("a", "/")])),
            1,
            "b",
            "/"
        ));
        assert!(may_forward(
            Some(&headers(vec![hop("a", "/")])),
            2,
            "b",
            "/"
        ));
        assert!(!may_forward(
            Some(&headers(vec![hop("b", "/")])),
            5,
            "b",
            "/"
        ));
        assert!(may_forward(
            Some(&headers(vec![hop("b", "other")])),
            5,
            "b",
            "/"
        ));
    }

    #[test]
    fn declaring_needs_a_max_hops() {
        let t = FederationUpstream;
        assert_eq!(
            t.validate(&FieldTable::default()).unwrap_err(),
            "Argument x-max-hops missing"
        );
        let mut a = FieldTable::default();
        a.insert("x-max-hops".into(), AMQPValue::LongString("x".into()));
        assert!(t.validate(&a).is_err());
        a.insert("x-max-hops".into(), AMQPValue::LongInt(1));
        t.validate(&a).unwrap();
    }
}
