//! A follower's stream protocol clients, carried to the leader frame by
//! frame so that a subscription is served here, from this node's own copy
//! (the applied state: only what is committed), while everything else the
//! client does goes to the leader as it came. Metadata names every member
//! as a replica (cluster/stream_ends.rs), and RabbitMQ's clients put their
//! consumers on replicas: reads then scale with the members.
//!
//! The carrier watches the handshake go by: the user the leader accepted
//! (PLAIN's name, or EXTERNAL's from the client certificate as this node
//! reads it), the frame max the client tuned, and the vhost the leader
//! opened. The open response is rewritten to name this node as
//! `advertised_host` / `advertised_port`, as RabbitMQ's nodes name
//! themselves: a client behind a load balancer reconnects until it
//! reaches the node Metadata named, and must be able to tell it reached a
//! replica.
//!
//! A Subscribe is served here when it joins no single active consumer
//! group (groups are the leader's), names a stream this node has applied
//! that the user may read, and an id not in use; its Credit and
//! Unsubscribe are answered here too. Any other Subscribe goes to the
//! leader, which serves or refuses it; the ids it may hold are kept, so
//! one id never names two subscriptions.

mod subscription;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::Semaphore;
use tracing::debug;

use super::Reads;
use crate::cluster::{Cluster, ProxyHeader};
use crate::stream_protocol::codes::*;
use crate::stream_protocol::out::{self, Out};
use crate::stream_protocol::subscribe::Subscribe;
use crate::stream_protocol::wire::{self, Fields, Malformed};
use crate::tls::identity::login_name;

/// The largest frame taken from the client before it tuned (the leader's
/// bound during the handshake).
const HANDSHAKE_MAX: usize = crate::stream_protocol::HANDSHAKE_FRAME_MAX as usize;

/// A carried connection's state, shared by its two directions and its
/// subscriptions here.
#[derive(Default)]
struct State {
    /// The user the client asked to log in as, and the correlation id of
    /// that SASL authenticate; the user once the leader accepted it.
    claimed: Option<(u32, String)>,
    user: Option<String>,
    /// The vhost the client asked to open, and the request's correlation
    /// id; the vhost once the leader opened it.
    opening: Option<(u32, String)>,
    vhost: Option<String>,
    /// A SASL authenticate, and an open, went by (a client sends one of
    /// each; a second spoils the connection: see `spoil`).
    authenticating: bool,
    opened: bool,
    spoiled: bool,
    /// The frame max the client tuned (0 before).
    frame_max: u32,
    /// The client takes Deliver version 2 (it said so in its
    /// ExchangeCommandVersions, which the leader answers).
    deliver_v2: bool,
    /// Subscriptions served here: their credit, and their tasks.
    local: HashMap<u8, Local>,
    /// Ids the leader may hold a subscription under.
    remote: HashSet<u8>,
    /// Subscribes and unsubscribes sent to the leader and not answered:
    /// correlation → id.
    asked_remote: HashMap<u32, u8>,
    unsubscribing: HashMap<u32, u8>,
    /// The last subscription's serial.
    serial: u64,
}

struct Local {
    credit: Arc<Semaphore>,
    task: tokio::task::AbortHandle,
    /// Tells it from an earlier subscription with its id.
    serial: u64,
}

type Shared = parking_lot::Mutex<State>;

impl State {
    /// A client that authenticates or opens twice is not served here: the
    /// leader refuses the second (and may close), but the carrier cannot
    /// tell which request the leader's answer was for, so it would not
    /// know the user or vhost for sure.
    fn spoil(&mut self) {
        self.spoiled = true;
        self.claimed = None;
        self.user = None;
        self.opening = None;
        self.vhost = None;
    }
}

/// How long the leader may hear nothing from a client whose frames are
/// all answered here before a heartbeat is sent on its behalf (the leader
/// closes a connection silent for two heartbeats; a consumer whose
/// credits are answered here sends none while it writes them).
const KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(1);
/// A heartbeat frame: size 4, key 23, version 1.
const HEARTBEAT_FRAME: [u8; 8] = [0, 0, 0, 4, 0, 23, 0, 1];

/// Carries stream protocol client `client` to the leader, serving its
/// subscriptions here where it can.
pub async fn carry<S>(cluster: Arc<Cluster>, client: S, header: ProxyHeader, reads: Arc<Reads>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let peer = header.client;
    let tls = header.tls;
    let external = header
        .certificate
        .as_deref()
        .and_then(|c| login_name(c, &reads.config.tls).ok());
    // What this node is named as (its listener's port for how the client
    // came).
    let own = cluster
        .stream_end()
        .and_then(|e| Some((e.host.clone(), e.port_for(tls)?)));
    let Some((upstream, leader)) = cluster.open_to_leader(header).await else {
        return;
    };
    let (client_r, client_w) = tokio::io::split(client);
    let (up_r, up_w) = tokio::io::split(upstream);
    let (out, writer) = out::start(client_w, reads.config.send_timeout());
    let shared = Arc::new(Shared::default());
    {
        let from_leader = from_leader(Arc::clone(&shared), up_r, out.clone(), own);
        let from_client = from_client(
            Arc::clone(&shared),
            Arc::clone(&reads),
            (client_r, up_w),
            external,
            out,
        );
        tokio::pin!(from_leader, from_client);
        let moved = cluster.leader_moved(leader);
        tokio::pin!(moved);
        let mut client_done = false;
        loop {
            tokio::select! {
                _ = &mut from_leader => break,
                _ = &mut from_client, if !client_done => client_done = true,
                _ = &mut moved => {
                    debug!(%peer, "the leader changed: closing the carried stream connection");
                    break;
                }
            }
        }
    }
    // The subscriptions here end with the connection; the writer ends
    // once every sender is gone (what is queued is written first).
    let local: Vec<Local> = shared.lock().local.drain().map(|(_, l)| l).collect();
    for l in local {
        l.task.abort();
    }
    let _ = writer.await;
}

/// Splits the first whole frame (its size field included) off `buf`:
/// Ok(None) if more bytes are needed, Err(size) for one larger than `max`.
fn cut(buf: &mut BytesMut, max: usize) -> Result<Option<Bytes>, usize> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let size = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if size > max {
        return Err(size);
    }
    if buf.len() < 4 + size {
        buf.reserve(4 + size - buf.len());
        return Ok(None);
    }
    Ok(Some(buf.split_to(4 + size).freeze()))
}

/// The leader's frames, passed to the client as they are but for the open
/// response (which names this node), noting what the handshake settled
/// and which subscriptions the leader refused.
async fn from_leader<R: AsyncRead + Unpin>(
    shared: Arc<Shared>,
    mut r: R,
    out: Out,
    own: Option<(String, u16)>,
) {
    let mut buf = BytesMut::with_capacity(64 << 10);
    loop {
        loop {
            // The leader's frames are its own: taken whatever their size.
            let f = match cut(&mut buf, usize::MAX) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(_) => return,
            };
            let f = leader_sent(&shared, f, own.as_ref());
            if !out.send(f).await {
                return;
            }
        }
        buf.reserve(64 << 10);
        match r.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// Notes what a leader's frame settles; returns what the client gets.
fn leader_sent(shared: &Shared, f: Bytes, own: Option<&(String, u16)>) -> Bytes {
    let mut fields = Fields::new(&f[4..]);
    let head =
        (|| Ok::<_, Malformed>((fields.u16()?, fields.u16()?, fields.u32()?, fields.u16()?)))();
    let Ok((key, _version, correlation, code)) = head else {
        return f;
    };
    let mut st = shared.lock();
    match key {
        k if k == SASL_AUTHENTICATE | RESPONSE => {
            if let Some((asked, user)) = st.claimed.take() {
                if asked == correlation && code == OK && !st.spoiled {
                    st.user = Some(user);
                }
            }
        }
        k if k == OPEN | RESPONSE => {
            if let Some((asked, vhost)) = st.opening.take() {
                if asked == correlation && code == OK && !st.spoiled {
                    st.vhost = Some(vhost);
                }
            }
            if let (OK, Some(own)) = (code, own) {
                return named(&f, fields, correlation, own).unwrap_or(f);
            }
        }
        k if k == UNSUBSCRIBE | RESPONSE => {
            if let Some(id) = st.unsubscribing.remove(&correlation) {
                st.remote.remove(&id);
            }
        }
        k if k == SUBSCRIBE | RESPONSE => {
            if let Some(id) = st.asked_remote.remove(&correlation) {
                // Refused: the leader holds nothing under the id (unless
                // it already did).
                if code != OK && code != SUBSCRIPTION_ID_ALREADY_EXISTS {
                    st.remote.remove(&id);
                }
            }
        }
        _ => {}
    }
    f
}

/// The open response `f` (its properties in `rest`) naming this node as
/// its advertised host and port.
fn named(f: &Bytes, mut rest: Fields<'_>, correlation: u32, own: &(String, u16)) -> Option<Bytes> {
    let properties = if rest.is_empty() {
        Vec::new()
    } else {
        rest.pairs().ok()?
    };
    let port = own.1.to_string();
    let kept = properties
        .into_iter()
        .filter(|(k, _)| *k != "advertised_host" && *k != "advertised_port");
    let ours = [
        ("advertised_host", own.0.as_str()),
        ("advertised_port", port.as_str()),
    ];
    let all: Vec<(&str, &str)> = kept.chain(ours).collect();
    let mut o = BytesMut::with_capacity(f.len() + 64);
    wire::response(&mut o, OPEN, correlation, OK, |o| {
        wire::put_pairs(o, all.into_iter())
    });
    Some(o.freeze())
}

/// The client's frames: what is for the leader is written to it (what one
/// read brought, in one write); a subscription this node serves starts
/// here, and its credit and unsubscribe are answered here.
async fn from_client<R, W>(
    shared: Arc<Shared>,
    reads: Arc<Reads>,
    (mut r, mut up): (R, W),
    external: Option<String>,
    out: Out,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = BytesMut::with_capacity(64 << 10);
    let mut to_leader = BytesMut::new();
    let mut opaque = false;
    let mut told = std::time::Instant::now();
    'reading: loop {
        buf.reserve(64 << 10);
        match r.read_buf(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        while !opaque {
            let max = match shared.lock().frame_max {
                0 => HANDSHAKE_MAX,
                n => n as usize,
            };
            let f = match cut(&mut buf, max) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                // Not a frame the leader takes: it refuses it, and from
                // here on the bytes pass as they come.
                Err(_) => {
                    opaque = true;
                    break;
                }
            };
            let answer = client_sent(&shared, &reads, &f, external.as_deref(), &out);
            match answer {
                Here::Forward => to_leader.put_slice(&f),
                Here::Answered(a) => {
                    if !out.send(a).await {
                        break 'reading;
                    }
                }
                Here::Served => {}
            }
        }
        if opaque {
            to_leader.unsplit(buf.split());
        }
        if to_leader.is_empty() && told.elapsed() >= KEEPALIVE {
            to_leader.put_slice(&HEARTBEAT_FRAME);
        }
        if !to_leader.is_empty() {
            if up.write_all(&to_leader).await.is_err() {
                break;
            }
            told = std::time::Instant::now();
        }
        to_leader.clear();
    }
    let _ = up.shutdown().await;
}

/// What became of a client's frame.
enum Here {
    /// It goes to the leader.
    Forward,
    /// Answered here with this frame.
    Answered(Bytes),
    /// Served here (a subscription's task answers it).
    Served,
}

fn client_sent(
    shared: &Arc<Shared>,
    reads: &Arc<Reads>,
    f: &[u8],
    external: Option<&str>,
    out: &Out,
) -> Here {
    let mut fields = Fields::new(&f[4..]);
    let (Ok(key), Ok(_version)) = (fields.u16(), fields.u16()) else {
        return Here::Forward;
    };
    let mut st = shared.lock();
    if handshake_sent(&mut st, key, &mut fields, external) {
        return Here::Forward;
    }
    match key {
        CREDIT => {
            if let (Ok(id), Ok(credit)) = (fields.u8(), fields.u16()) {
                if let Some(l) = st.local.get(&id) {
                    l.credit.add_permits(credit as usize);
                    return Here::Served;
                }
            }
        }
        UNSUBSCRIBE => {
            let Ok(correlation) = fields.u32() else {
                return Here::Forward;
            };
            let Ok(id) = fields.u8() else {
                return Here::Forward;
            };
            if let Some(l) = st.local.remove(&id) {
                l.task.abort();
                return Here::Answered(answer(UNSUBSCRIBE, correlation, OK));
            }
            // Free once the leader answers (whatever it answers: its
            // chunks for the id end before that); a reused correlation id
            // leaves it held.
            if st.remote.contains(&id) && !st.unsubscribing.contains_key(&correlation) {
                st.unsubscribing.insert(correlation, id);
            }
        }
        SUBSCRIBE => {
            let Ok(correlation) = fields.u32() else {
                return Here::Forward;
            };
            let Ok(asked) = Subscribe::parse(&mut fields) else {
                return Here::Forward;
            };
            drop(st);
            return subscribe(shared, reads, correlation, &asked, out);
        }
        _ => {}
    }
    Here::Forward
}

/// Notes what a client's handshake frame (or its ExchangeCommandVersions)
/// says; true if it was one.
fn handshake_sent(
    st: &mut State,
    key: u16,
    fields: &mut Fields<'_>,
    external: Option<&str>,
) -> bool {
    match key {
        SASL_AUTHENTICATE => match st.authenticating {
            true => st.spoil(),
            false => {
                st.authenticating = true;
                st.claimed = sasl_user(fields, external);
            }
        },
        // The client answers the server's tune with the same command; the
        // leader takes the last before the open.
        k if k & !RESPONSE == TUNE => {
            if let (Ok(frame_max), false) = (fields.u32(), st.opened) {
                use crate::stream_protocol::{tuned_value, FRAME_MAX};
                st.frame_max = tuned_value(FRAME_MAX, frame_max);
            }
        }
        OPEN => match st.opened {
            true => st.spoil(),
            false => {
                st.opened = true;
                if let (Ok(correlation), Ok(vhost)) = (fields.u32(), fields.string()) {
                    if !st.spoiled {
                        st.opening = Some((correlation, vhost.to_string()));
                    }
                }
            }
        },
        EXCHANGE_COMMAND_VERSIONS => {
            let theirs = (|| {
                fields.u32()?;
                let n = fields.count(6)?;
                let mut theirs = Vec::with_capacity(n);
                for _ in 0..n {
                    theirs.push((fields.u16()?, fields.u16()?, fields.u16()?));
                }
                Ok::<_, Malformed>(theirs)
            })();
            if let Ok(theirs) = theirs {
                st.deliver_v2 = crate::stream_protocol::subscribe::speaks_deliver_v2(&theirs);
            }
        }
        _ => return false,
    }
    true
}

/// Serves Subscribe `asked` here if this node may (see the module's doc),
/// else leaves it to the leader. The stream and the user's permission are
/// looked up without the connection's lock.
fn subscribe(
    shared: &Arc<Shared>,
    reads: &Arc<Reads>,
    correlation: u32,
    asked: &Subscribe<'_>,
    out: &Out,
) -> Here {
    let id = asked.id;
    let (user, vhost, frame_max, v2) = {
        let mut st = shared.lock();
        if st.local.contains_key(&id) {
            let a = answer(SUBSCRIBE, correlation, SUBSCRIPTION_ID_ALREADY_EXISTS);
            return Here::Answered(a);
        }
        match (&st.user, &st.vhost, st.remote.contains(&id)) {
            (Some(u), Some(v), false) => (u.clone(), v.clone(), st.frame_max, st.deliver_v2),
            _ => return remote(&mut st, correlation, id),
        }
    };
    let plan = subscription::plan(reads, asked, &user, &vhost);
    let mut st = shared.lock();
    let Some(plan) = plan else {
        return remote(&mut st, correlation, id);
    };
    debug!(stream = asked.stream, %vhost, "serving a stream subscription from this follower's copy");
    let credit = Arc::new(Semaphore::new(asked.credit as usize));
    st.serial += 1;
    let serial = st.serial;
    let sub = subscription::Sub {
        id,
        serial,
        correlation,
        stream: asked.stream.to_string(),
        vhost,
        plan,
        credit: Arc::clone(&credit),
        committed: reads.log.committed(),
        frame_max,
        v2,
    };
    let served = subscription::serve(Arc::clone(shared), Arc::clone(reads), out.clone(), sub);
    let task = tokio::spawn(served).abort_handle();
    let local = Local {
        credit,
        task,
        serial,
    };
    st.local.insert(id, local);
    Here::Served
}

/// Subscribe `correlation` goes to the leader, which may hold `id` from
/// then on (for good if the client reused a correlation id still
/// waiting: the answer could be either's).
fn remote(st: &mut State, correlation: u32, id: u8) -> Here {
    st.remote.insert(id);
    st.asked_remote.entry(correlation).or_insert(id);
    Here::Forward
}

/// The user a SASL authenticate asks for (after its correlation id,
/// returned with it): PLAIN's authcid, or EXTERNAL's certificate name.
fn sasl_user(f: &mut Fields<'_>, external: Option<&str>) -> Option<(u32, String)> {
    let correlation = f.u32().ok()?;
    let mechanism = f.string().ok()?;
    let data = f.bytes().ok()?;
    let user = match mechanism {
        "EXTERNAL" => external?.to_string(),
        "PLAIN" => {
            let mut parts = data.splitn(3, |&b| b == 0);
            let (_, name) = (parts.next()?, parts.next()?);
            parts.next()?;
            String::from_utf8_lossy(name).into_owned()
        }
        _ => return None,
    };
    Some((correlation, user))
}

/// A response with nothing after its code.
fn answer(key: u16, correlation: u32, code: u16) -> Bytes {
    let mut o = BytesMut::with_capacity(16);
    wire::response(&mut o, key, correlation, code, |_| {});
    o.freeze()
}

#[cfg(test)]
mod tests;
