//! Whether a declare would succeed, changing nothing: definitions import
//! checks a whole file before it applies any of it. The checks are the
//! declare's own (names, reserved prefixes, arguments, exchange types,
//! equivalence with what exists), for a vhost that exists or one the file
//! is about to make (`vh` None: nothing exists in it yet).

use super::equivalence::{self, Mismatch};
use super::error::{Error, Result};
use super::{ExchangeSpec, QueueSpec, VHost};
use crate::exchange::ExchangeKind;
use crate::plugins::Plugins;

fn describe(vhost: &str, kind: &str, name: &str) -> String {
    format!("{kind} '{name}' in vhost '{vhost}'")
}

/// Whether declaring the queue `spec` in `vhost` would succeed.
pub fn queue(vh: Option<&VHost>, vhost: &str, spec: &QueueSpec) -> Result<()> {
    if spec.name.is_empty() || spec.name.len() > 255 {
        return Err(Error::precondition_failed(format!(
            "queue name '{}' must be 1 to 255 bytes",
            spec.name
        )));
    }
    if spec.name.starts_with("amq.") {
        return Err(Error::access_refused(format!(
            "queue name '{}' contains reserved prefix 'amq.*'",
            spec.name
        )));
    }
    let subject = describe(vhost, "queue", &spec.name);
    crate::queue::args::validate(&spec.arguments, &subject).map_err(Error::precondition_failed)?;
    crate::dedup::args::validate(&spec.arguments, &subject).map_err(Error::precondition_failed)?;
    let kind = crate::queue::kind::Kind::of(&spec.arguments);
    crate::queue::kind::check_declare(kind, spec.declared(), &subject)
        .map_err(Error::precondition_failed)?;
    if let Some(q) = vh.and_then(|v| v.queue(&spec.name)) {
        match equivalence::queue(spec, &q.config, &subject) {
            Ok(()) => {}
            Err(Mismatch::Exclusive) => return Err(super::queues::locked(&subject)),
            Err(Mismatch::Field(text)) => return Err(Error::precondition_failed(text)),
        }
    }
    Ok(())
}

/// Whether declaring the exchange `spec` in `vhost` would succeed.
pub fn exchange(
    vh: Option<&VHost>,
    vhost: &str,
    plugins: &Plugins,
    spec: &ExchangeSpec,
) -> Result<()> {
    if spec.name.is_empty() || spec.name.len() > 255 {
        return Err(Error::precondition_failed(format!(
            "exchange name '{}' must be 1 to 255 bytes",
            spec.name
        )));
    }
    if ExchangeKind::parse(&spec.kind).is_none() {
        let t = plugins.exchange_type(&spec.kind).ok_or_else(|| {
            Error::command_invalid(format!("unknown exchange type '{}'", spec.kind))
        })?;
        t.validate(&spec.arguments)
            .map_err(Error::precondition_failed)?;
    }
    match vh.and_then(|v| v.exchange(&spec.name)) {
        Some(x) => {
            let subject = describe(vhost, "exchange", &spec.name);
            equivalence::exchange(spec, &x, &subject).map_err(Error::precondition_failed)
        }
        None if spec.name.starts_with("amq.") => Err(Error::access_refused(format!(
            "exchange name '{}' contains reserved prefix 'amq.*'",
            spec.name
        ))),
        None => {
            let subject = describe(vhost, "exchange", &spec.name);
            super::exchanges::check_alternate(&spec.arguments, &subject)?;
            crate::dedup::args::validate(&spec.arguments, &subject)
                .map_err(Error::precondition_failed)
        }
    }
}
