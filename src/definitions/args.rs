//! Arguments (AMQP field tables) as definitions files write them: JSON
//! objects whose numbers, strings, booleans, lists and objects stand for
//! the field values. Integers are read as signed 64-bit ("l"), as
//! RabbitMQ's import reads them; other numbers as doubles.

use amq_protocol::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use serde_json::{Map, Number, Value};

/// A field table as JSON.
pub fn to_json(t: &FieldTable) -> Value {
    let mut m = Map::new();
    for (k, v) in t.inner() {
        m.insert(k.as_str().to_string(), value_to_json(v));
    }
    Value::Object(m)
}

fn value_to_json(v: &AMQPValue) -> Value {
    let num = |f: f64| Number::from_f64(f).map_or(Value::String(f.to_string()), Value::Number);
    match v {
        AMQPValue::Boolean(b) => Value::Bool(*b),
        AMQPValue::ShortShortInt(n) => (*n).into(),
        AMQPValue::ShortShortUInt(n) => (*n).into(),
        AMQPValue::ShortInt(n) => (*n).into(),
        AMQPValue::ShortUInt(n) => (*n).into(),
        AMQPValue::LongInt(n) => (*n).into(),
        AMQPValue::LongUInt(n) => (*n).into(),
        AMQPValue::LongLongInt(n) => (*n).into(),
        AMQPValue::Timestamp(n) => (*n).into(),
        AMQPValue::Float(f) => num(*f as f64),
        AMQPValue::Double(f) => num(*f),
        AMQPValue::DecimalValue(d) => num(d.value as f64 / 10f64.powi(d.scale as i32)),
        AMQPValue::ShortString(s) => Value::String(s.as_str().to_string()),
        AMQPValue::LongString(s) => {
            Value::String(String::from_utf8_lossy(s.as_bytes()).into_owned())
        }
        AMQPValue::ByteArray(b) => {
            Value::String(String::from_utf8_lossy(b.as_slice()).into_owned())
        }
        AMQPValue::FieldArray(a) => Value::Array(a.as_slice().iter().map(value_to_json).collect()),
        AMQPValue::FieldTable(t) => to_json(t),
        AMQPValue::Void => Value::Null,
    }
}

/// A JSON object as a field table; `what` names it in the error (none if
/// empty: the management API words errors as RabbitMQ's, bare). A null
/// value within is refused, as RabbitMQ refuses it ("null_not_allowed").
pub fn from_json(v: Option<&Value>, what: &str) -> Result<FieldTable, String> {
    match v {
        None | Some(Value::Null) => Ok(FieldTable::default()),
        Some(Value::Object(m)) => table_at(m, 1, what),
        Some(other) => Err(at(
            what,
            format!("arguments must be an object, not {other}"),
        )),
    }
}

fn at(what: &str, why: String) -> String {
    if what.is_empty() {
        why
    } else {
        format!("{what}: {why}")
    }
}

fn table_at(m: &Map<String, Value>, depth: usize, what: &str) -> Result<FieldTable, String> {
    let mut t = FieldTable::default();
    for (k, v) in m {
        if k.len() > 255 {
            return Err(at(what, "argument name longer than 255 bytes".into()));
        }
        t.insert(
            ShortString::from(k.clone()),
            json_to_value(v, depth + 1, what)?,
        );
    }
    Ok(t)
}

fn json_to_value(v: &Value, depth: usize, what: &str) -> Result<AMQPValue, String> {
    // As deep as the wire takes (wire/table.rs allows 64 levels).
    if depth > 60 {
        return Err(at(what, "arguments nested too deep".into()));
    }
    Ok(match v {
        Value::Null => return Err(at(what, "null_not_allowed".into())),
        Value::Bool(b) => AMQPValue::Boolean(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => AMQPValue::LongLongInt(i),
            None => AMQPValue::Double(n.as_f64().unwrap_or(0.0)),
        },
        Value::String(s) => AMQPValue::LongString(LongString::from(s.as_bytes().to_vec())),
        Value::Array(items) => {
            let mut a = FieldArray::default();
            for item in items {
                a.push(json_to_value(item, depth + 1, what)?);
            }
            AMQPValue::FieldArray(a)
        }
        Value::Object(m) => AMQPValue::FieldTable(table_at(m, depth, what)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn arguments_round_trip_through_json() {
        let v = json!({"x-max-length": 10, "x-dead-letter-exchange": "dlx", "ok": true,
                       "ratio": 0.5, "list": [1, "a"], "nested": {"k": "v"}});
        let t = from_json(Some(&v), "queue 'q'").unwrap();
        assert_eq!(
            t.inner().get("x-max-length"),
            Some(&AMQPValue::LongLongInt(10))
        );
        assert_eq!(to_json(&t), v);
        assert!(from_json(Some(&json!([1])), "queue 'q'")
            .unwrap_err()
            .contains("queue 'q'"));
    }

    #[test]
    fn a_null_value_is_refused_as_rabbitmq_refuses_it() {
        let v = json!({"nested": {"list": [1, null]}});
        assert_eq!(from_json(Some(&v), "").unwrap_err(), "null_not_allowed");
        assert_eq!(
            from_json(Some(&v), "queue 'q'").unwrap_err(),
            "queue 'q': null_not_allowed"
        );
    }
}
