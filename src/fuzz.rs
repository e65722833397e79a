//! Entry points for the fuzz targets under `fuzz/` (cargo-fuzz, on the
//! nightly toolchain) and for the stable test that replays their corpus
//! (`tests/fuzz_corpus.rs`). Each takes arbitrary bytes and must neither
//! panic nor hang; what a target checks beyond that is said at its entry.

use std::io::{Read, Write};
use std::sync::OnceLock;
use std::time::Duration;

use bytes::{Bytes, BytesMut};

use crate::amqp::assembler::{self, Assembler, Step};
use crate::amqp::codec::{self, Frame};
use crate::wire::{props, table};

/// Cuts frames from `data` until it runs out or is refused; the first
/// octet picks frame_max. Cut frames must lie within the input.
pub fn frame_cutter(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let frame_max = [4096, 131_072, 0, 65_536][pick as usize % 4];
    let mut buf = BytesMut::from(rest);
    let mut cut = 0;
    while let Ok(Some(frame)) = codec::decode(&mut buf, frame_max) {
        cut += match &frame {
            Frame::Publish { raw, .. } => raw.len(),
            Frame::Method { payload, .. }
            | Frame::Header { payload, .. }
            | Frame::Body { payload, .. } => payload.len() + codec::FRAME_OVERHEAD,
            Frame::Heartbeat { .. } => codec::FRAME_OVERHEAD,
        };
        assert!(cut <= rest.len(), "cut more than was given");
    }
}

/// Feeds the frames cut from `data` through the publish assembler, as a
/// channel does (a one-piece publish as its three parts).
pub fn publish_assembler(data: &[u8]) {
    let mut buf = BytesMut::from(data);
    let mut a = Assembler::default();
    let max_size = 1 << 20;
    let step = |a: &mut Assembler, r: Result<Step, _>| {
        if let Ok(Step::Done(_, msg)) = r {
            // What is re-sent to a consumer must read back.
            let _ = crate::message::read_meta(msg.properties());
            let _ = (msg.exchange(), msg.routing_key(), msg.body().len());
        }
        if a.is_busy() {
            let _ = a.interrupted();
        }
    };
    while let Ok(Some(frame)) = codec::decode(&mut buf, 131_072) {
        match frame {
            Frame::Method { payload, .. } => {
                if let Some(p) = assembler::parse_publish(&payload) {
                    a.start(p);
                }
            }
            Frame::Header { payload, .. } => {
                let r = a.header(&payload, max_size, None);
                step(&mut a, r);
            }
            Frame::Body { payload, .. } => {
                let r = a.body(payload, None);
                step(&mut a, r);
            }
            Frame::Publish {
                raw,
                header_at,
                body_at,
                ..
            } => {
                let (m, h, b) = codec::publish_payloads(&raw, header_at, body_at);
                let Some(p) = assembler::parse_publish(&m) else {
                    continue;
                };
                a.start(p);
                let r = a.header(&h, max_size, Some(&raw));
                let done = matches!(r, Ok(Step::Done(..)));
                step(&mut a, r);
                if let (false, Some(b)) = (done, b) {
                    let r = a.body(b, Some(&raw));
                    step(&mut a, r);
                }
            }
            Frame::Heartbeat { .. } => {}
        }
    }
}

/// Checks, reads, converts and edits `data` as a field table, and as a
/// property list. A table that passes the check must decode, and an edit
/// of a well-formed table or property list must be well formed.
pub fn field_table(data: &[u8]) {
    if let Ok(n) = table::check_table(data) {
        let t = &data[..n];
        let decoded = table::decode_table(t);
        assert!(decoded.is_some(), "checked but not decodable");
        // amq-protocol parses what passed the check without trouble.
        let _ = amq_protocol::types::parsing::parse_field_table(t);
        for (k, v) in table::entries(t) {
            let _ = (k.len(), v.as_int(), v.as_long_str());
            if let Some(items) = v.as_array() {
                items.count();
            }
        }
        let mut v = Vec::new();
        table::encode_value(&mut v, &amq_protocol::types::AMQPValue::LongLongInt(1));
        let edited = table::edit(t, &[(b"x", &v)], &[b"y"]);
        assert!(table::check_table(&edited).is_ok(), "an edit broke a table");
    }
    let _ = table::check_array(data);
    if props::layout(data).is_ok() {
        let _ = crate::message::read_meta(data);
        let mut v = Vec::new();
        table::encode_value(&mut v, &amq_protocol::types::AMQPValue::Boolean(true));
        let edited = props::edit_headers(data, &[(b"x-death", &v)], &[b"BCC"]);
        let edited = edited.expect("a well-formed list can be edited");
        assert!(
            props::layout(&edited).is_ok(),
            "an edit broke a property list"
        );
        let cut = props::with_field(data, props::Field::Expiration, None);
        assert!(cut.is_some_and(|p| props::layout(&p).is_ok()));
    }
}

/// Parses `data` as a method payload, as the channel's front end does.
pub fn method_parser(data: &[u8]) {
    let _ = codec::parse_method(data);
    let _ = codec::method_ids(data);
    let _ = assembler::parse_publish(&Bytes::copy_from_slice(data));
}

/// A broker in this process for `connection`.
struct Harness {
    rt: tokio::runtime::Runtime,
    addr: std::net::SocketAddr,
    _server: crate::Server,
}

fn harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let dir = std::env::temp_dir().join(format!("warren-fuzz-{}", std::process::id()));
        // Removed when the process exits normally (a test run); a fuzzer
        // that aborts on a crash leaves it, with the crash to look at.
        static DIR: OnceLock<std::path::PathBuf> = OnceLock::new();
        extern "C" fn remove_dir() {
            if let Some(d) = DIR.get() {
                let _ = std::fs::remove_dir_all(d);
            }
        }
        if DIR.set(dir.clone()).is_ok() {
            // SAFETY: registers a plain function to run at exit.
            unsafe { libc::atexit(remove_dir) };
        }
        let config = crate::Config {
            bind: [127, 0, 0, 1].into(),
            port: crate::config::Port::On(0),
            management_port: crate::config::Port::Off,
            prometheus_port: crate::config::Port::Off,
            data_dir: dir,
            store_cache_mb: 16,
            handshake_close_delay_ms: 0,
            heartbeat: 0,
            ..crate::Config::default()
        };
        let server = rt.block_on(crate::Server::start(config)).expect("a broker");
        Harness {
            rt,
            addr: server.addr,
            _server: server,
        }
    })
}

/// The frames of a good handshake as guest on "/", up to connection.open.
fn handshake() -> Vec<u8> {
    use amq_protocol::frame::{gen_frame, AMQPFrame, WriteContext};
    use amq_protocol::protocol::{connection as c, AMQPClass};
    let mut out = b"AMQP\x00\x00\x09\x01".to_vec();
    for m in [
        AMQPClass::Connection(c::AMQPMethod::StartOk(c::StartOk {
            client_properties: Default::default(),
            mechanism: "PLAIN".into(),
            response: "\0guest\0guest".into(),
            locale: "en_US".into(),
        })),
        AMQPClass::Connection(c::AMQPMethod::TuneOk(c::TuneOk {
            channel_max: 16,
            frame_max: 131_072,
            heartbeat: 0,
        })),
        AMQPClass::Connection(c::AMQPMethod::Open(c::Open {
            virtual_host: "/".into(),
        })),
    ] {
        if let Ok(w) = gen_frame(&AMQPFrame::Method(0, m))(WriteContext::from(Vec::new())) {
            out.extend_from_slice(&w.write);
        }
    }
    out
}

/// Sends `data` on a connection to a broker in this process: after a good
/// handshake when the first octet is even, from the first byte on when
/// odd. The broker must not panic (a fuzz target aborts on any panic, a
/// connection task's included) and other connections must still work.
pub fn connection(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let h = harness();
    let Ok(mut s) = std::net::TcpStream::connect(h.addr) else {
        return;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let mut bytes = if pick % 2 == 0 {
        handshake()
    } else {
        Vec::new()
    };
    bytes.extend_from_slice(rest);
    let _ = s.write_all(&bytes);
    let _ = s.shutdown(std::net::Shutdown::Write);
    // Read what the broker says until it closes or goes quiet.
    let mut sink = [0u8; 65_536];
    while let Ok(n) = s.read(&mut sink) {
        if n == 0 {
            break;
        }
    }
    // The broker still answers a new connection.
    h.rt.block_on(async {
        let probe = tokio::net::TcpStream::connect(h.addr).await;
        assert!(probe.is_ok(), "the broker stopped accepting");
    });
}
