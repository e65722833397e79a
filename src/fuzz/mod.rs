//! Entry points for the fuzz targets under `fuzz/` (cargo-fuzz, on the
//! nightly toolchain) and for the stable test that replays their corpus
//! (`tests/broker/fuzz_corpus.rs`). Each takes arbitrary bytes and must neither
//! panic nor hang; what a target checks beyond that is said at its entry.

use std::io::{Read, Write};
use std::sync::OnceLock;
use std::time::Duration;

use bytes::{Bytes, BytesMut};

use crate::amqp::assembler::{self, Assembler, Step};
use crate::amqp::codec::{self, Frame};
use crate::wire::{props, table};

mod stream;

pub use stream::{amqp10_message, stream_connection};

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

/// A broker in this process: one for `connection`, another for
/// `http_request` (whose requests may change anything), and one for the
/// stream protocol (stream.rs), so that no target's inputs change what
/// another's meet.
struct Harness {
    rt: tokio::runtime::Runtime,
    addr: std::net::SocketAddr,
    /// Where the stream protocol listens (its harness only).
    stream_addr: Option<std::net::SocketAddr>,
    _server: crate::Server,
}

static AMQP_HARNESS: OnceLock<Harness> = OnceLock::new();
static HTTP_HARNESS: OnceLock<Harness> = OnceLock::new();

fn harness(slot: &'static OnceLock<Harness>, name: &str) -> &'static Harness {
    harness_with(slot, name, false)
}

/// The harness in `slot`, started with the stream protocol's listener if
/// `stream` (on an ephemeral port).
fn harness_with(slot: &'static OnceLock<Harness>, name: &str, stream: bool) -> &'static Harness {
    slot.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let top = std::env::temp_dir().join(format!("warren-fuzz-{}", std::process::id()));
        // Removed when the process exits normally (a test run); a fuzzer
        // that aborts on a crash leaves it, with the crash to look at.
        static DIR: OnceLock<std::path::PathBuf> = OnceLock::new();
        extern "C" fn remove_dir() {
            if let Some(d) = DIR.get() {
                let _ = std::fs::remove_dir_all(d);
            }
        }
        if DIR.set(top.clone()).is_ok() {
            // SAFETY: registers a plain function to run at exit.
            unsafe { libc::atexit(remove_dir) };
            // A fuzz target has no Rust `main` to ignore SIGPIPE: a write
            // to a connection the broker closed would kill the fuzzer.
            // SAFETY: sets a signal's disposition to ignore, nothing else.
            unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
        }
        let dir = top.join(name);
        let config = crate::Config {
            bind: [127, 0, 0, 1].into(),
            port: crate::config::Port::On(0),
            management_port: crate::config::Port::Off,
            prometheus_port: crate::config::Port::Off,
            stream_port: if stream {
                crate::config::Port::On(0)
            } else {
                crate::config::Port::Off
            },
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
            stream_addr: server.stream_addr,
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
    let h = harness(&AMQP_HARNESS, "amqp");
    let mut bytes = if pick % 2 == 0 {
        handshake()
    } else {
        Vec::new()
    };
    bytes.extend_from_slice(rest);
    talk(h, h.addr, &bytes);
}

/// Writes `bytes` to a new connection to `addr` (a listener of `h`'s
/// broker), reads what the broker says until it closes or goes quiet,
/// and checks that the listener still takes a connection.
fn talk(h: &Harness, addr: std::net::SocketAddr, bytes: &[u8]) {
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let _ = s.write_all(bytes);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut sink = [0u8; 65_536];
    while let Ok(n) = s.read(&mut sink) {
        if n == 0 {
            break;
        }
    }
    h.rt.block_on(async {
        let probe = tokio::net::TcpStream::connect(addr).await;
        assert!(probe.is_ok(), "the broker stopped accepting");
    });
}

/// The API's routes on the harness's broker, with a user of each kind
/// besides guest (an administrator): "mon" (monitoring), "mgmt"
/// (management, permissions on "/") and "none" (no tags).
fn api_routes() -> &'static axum::Router {
    static ROUTES: OnceLock<axum::Router> = OnceLock::new();
    ROUTES.get_or_init(|| {
        let h = harness(&HTTP_HARNESS, "http");
        let broker = std::sync::Arc::clone(&h._server.broker);
        let _guard = h.rt.enter();
        crate::http::routes(crate::http::Api::new(broker, Vec::new(), Vec::new()))
    })
}

/// Puts back the fuzz users as they were where a request deleted one or
/// changed its password, tags or permissions on "/" (without them the
/// rest of a run would mostly see 401s).
fn ensure_users(broker: &crate::broker::Broker) {
    for (name, tag) in [
        ("guest", "administrator"),
        ("mon", "monitoring"),
        ("mgmt", "management"),
        ("none", ""),
    ] {
        let whole = broker.users.authenticate(name, name).is_some_and(|u| {
            u.tags
                .iter()
                .map(String::as_str)
                .eq(Some(tag).filter(|t| !t.is_empty()))
        });
        if whole && broker.users.permission(name, "/").is_some() {
            continue;
        }
        // Each one's password is its name.
        let mut u = crate::access::User::with_password(name, name);
        u.tags = Some(tag)
            .filter(|t| !t.is_empty())
            .map(str::to_string)
            .into_iter()
            .collect();
        let _ = broker.users.put_user(u);
        let _ = broker.users.set_permission(name, "/", ".*", ".*", ".*");
    }
}

/// Paths the fuzzer's text is appended to, so that it reaches the
/// handlers behind them rather than only the router's 404.
const API_PATHS: [&str; 16] = [
    "/api/",
    "/api/queues/%2F/",
    "/api/exchanges/%2F/",
    "/api/bindings/%2F/e/amq.direct/q/",
    "/api/definitions",
    "/api/users/",
    "/api/permissions/%2F/",
    "/api/policies/%2F/",
    "/api/parameters/",
    "/api/vhosts/",
    "/api/connections/",
    "/api/exchanges/%2F/amq.direct/publish",
    "/api/queues/%2F/q/get",
    "/api/topic-permissions/%2F/",
    "/api/health/checks/",
    "/api/queues?",
];

/// Answers one request made of `data` through the API's routes in this
/// process, as a listener would hand it on (peer 127.0.0.1). Octet 0
/// picks the method, octet 1 the credentials (guest, a monitoring, a
/// management or an untagged user, a wrong password, none, or raw bytes),
/// octet 2 a path to start from (or the text alone); the rest is the path
/// and query, then after a NUL the headers ("name: value" lines), then
/// after another NUL the body. The answer must come (within 10 s) and no
/// request may panic; memory is bounded by the API's own limits, which
/// the fuzz run enforces with libFuzzer's -malloc_limit_mb.
pub fn http_request(data: &[u8]) {
    use axum::body::Body;
    use axum::extract::ConnectInfo;
    use axum::http::{HeaderName, HeaderValue, Method, Request};
    use base64::Engine;
    use tower::ServiceExt;

    let [m, who, start, rest @ ..] = data else {
        return;
    };
    let method = match m % 8 {
        0 => Method::GET,
        1 => Method::PUT,
        2 => Method::POST,
        3 => Method::DELETE,
        4 => Method::HEAD,
        5 => Method::OPTIONS,
        6 => Method::PATCH,
        _ => Method::from_bytes(&rest[..rest.len().min(8)]).unwrap_or(Method::GET),
    };
    let mut parts = rest.splitn(3, |&b| b == 0);
    let path = parts.next().unwrap_or_default();
    let headers = parts.next().unwrap_or_default();
    let body = parts.next().unwrap_or_default();
    let mut uri = match API_PATHS.get(*start as usize) {
        Some(p) => p.as_bytes().to_vec(),
        None => Vec::new(),
    };
    uri.extend_from_slice(path);
    if uri.first() != Some(&b'/') {
        uri.insert(0, b'/');
    }
    let Ok(uri) = axum::http::Uri::try_from(uri) else {
        return;
    };
    let mut req = Request::builder().method(method).uri(uri);
    let basic = |user: &str, pass: &str| {
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
        format!("Basic {token}").into_bytes()
    };
    let auth = match who % 7 {
        0 => Some(basic("guest", "guest")),
        1 => Some(basic("mon", "mon")),
        2 => Some(basic("mgmt", "mgmt")),
        3 => Some(basic("none", "none")),
        4 => Some(basic("guest", "wrong")),
        5 => None,
        _ => Some(
            headers
                .split(|&b| b == b'\n')
                .next()
                .unwrap_or_default()
                .to_vec(),
        ),
    };
    if let Some(a) = auth.and_then(|a| HeaderValue::from_bytes(&a).ok()) {
        req = req.header("authorization", a);
    }
    let mut typed = false;
    for line in headers.split(|&b| b == b'\n') {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii());
        if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value)) {
            typed |= n == "content-type";
            req = req.header(n, v);
        }
    }
    if !typed {
        req = req.header("content-type", "application/json");
    }
    let Ok(mut req) = req.body(Body::from(body.to_vec())) else {
        return;
    };
    req.extensions_mut()
        .insert(ConnectInfo(std::net::SocketAddr::from((
            [127, 0, 0, 1],
            40000,
        ))));
    let app = api_routes().clone();
    let h = harness(&HTTP_HARNESS, "http");
    ensure_users(&h._server.broker);
    let answered = h.rt.block_on(async {
        let answer = tokio::time::timeout(Duration::from_secs(10), app.oneshot(req)).await;
        match answer {
            Ok(Ok(r)) => {
                // The whole answer, as a client would read it.
                let _ = axum::body::to_bytes(r.into_body(), 64 << 20).await;
                true
            }
            Ok(Err(never)) => match never {},
            Err(_) => false,
        }
    });
    assert!(answered, "no answer within 10 s");
}
