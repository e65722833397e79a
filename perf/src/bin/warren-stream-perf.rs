//! `warren-stream-perf`: a load generator for RabbitMQ's stream protocol
//! (port 5552), with RabbitMQ's own Rust stream client, for comparing
//! Warren with RabbitMQ's stream plugin (perf/stream.sh runs both).
//!
//! One run: creates a stream, publishes `--count` messages of `--size`
//! bytes in batches of `--batch` with confirms (`--window` messages
//! unconfirmed at most), then reads the whole stream from the first
//! offset with each reader count of `--readers` (each reader reads every
//! message), and deletes the stream (unless `--keep`). With `--pid`, the broker's CPU time
//! (utime + stime from /proc) is measured over each phase. Prints one JSON
//! object: per phase the message rate and the broker's CPU per message.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use rabbitmq_stream_client::types::{ByteCapacity, Message, OffsetSpecification};
use rabbitmq_stream_client::Environment;
use serde_json::json;
use tokio::sync::Semaphore;

#[derive(Parser, Debug)]
#[command(about = "Stream protocol load generator (publish with confirms, then read)")]
struct Args {
    /// Broker host.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Stream protocol port.
    #[arg(long, default_value_t = 5552)]
    port: u16,
    /// Messages to publish.
    #[arg(long, default_value_t = 1_000_000)]
    count: u64,
    /// Body size in bytes.
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// Messages per publish batch.
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// Messages published and not yet confirmed, at most.
    #[arg(long, default_value_t = 10_000)]
    window: usize,
    /// Reader counts to read the stream with, one phase each (comma
    /// separated; empty: no reads).
    #[arg(long, default_value = "1,10")]
    readers: String,
    /// The broker's PID, to measure its CPU time per message.
    #[arg(long)]
    pid: Option<u32>,
    /// The stream's name.
    #[arg(long, default_value = "perf-stream")]
    stream: String,
    /// Leaves the stream in place at the end (to measure what it takes).
    #[arg(long)]
    keep: bool,
}

/// The broker's CPU time so far (user + system), in microseconds.
fn cpu_us(pid: Option<u32>) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid?)).ok()?;
    // Fields after the command name (which may hold spaces) start after ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some(ticks * 1_000_000 / hz)
}

/// A phase's rate and the broker's CPU per message.
fn phase(
    name: &str,
    messages: u64,
    started: Instant,
    cpu0: Option<u64>,
    pid: Option<u32>,
) -> serde_json::Value {
    let secs = started.elapsed().as_secs_f64();
    let cpu = cpu0
        .zip(cpu_us(pid))
        .map(|(a, b)| (b - a) as f64 / messages.max(1) as f64);
    eprintln!(
        "{name}: {messages} messages in {secs:.2} s = {:.0} msg/s; broker CPU {} us/msg",
        messages as f64 / secs,
        cpu.map_or("n/a".to_string(), |c| format!("{c:.2}"))
    );
    json!({
        "messages": messages,
        "seconds": secs,
        "rate": messages as f64 / secs,
        "broker_cpu_us_per_msg": cpu,
    })
}

async fn publish(env: &Environment, a: &Args) -> anyhow::Result<serde_json::Value> {
    let producer = env.producer().batch_size(a.batch).build(&a.stream).await?;
    let window = Arc::new(Semaphore::new(a.window.max(a.batch)));
    let failed = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let body = vec![b'x'; a.size];
    let cpu0 = cpu_us(a.pid);
    let started = Instant::now();
    let mut sent = 0u64;
    while sent < a.count {
        let n = (a.count - sent).min(a.batch as u64) as usize;
        window.acquire_many(n as u32).await?.forget();
        let batch: Vec<Message> = (0..n)
            .map(|_| Message::builder().body(body.clone()).build())
            .collect();
        let (w, f) = (Arc::clone(&window), Arc::clone(&failed));
        producer
            .batch_send(batch, move |status| {
                let (w, f) = (Arc::clone(&w), Arc::clone(&f));
                async move {
                    if !matches!(status, Ok(ref s) if s.confirmed()) {
                        f.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    w.add_permits(1);
                }
            })
            .await?;
        sent += n as u64;
    }
    // Every permit back: everything confirmed (or failed).
    let all = a.window.max(a.batch) as u32;
    let _all_back =
        tokio::time::timeout(Duration::from_secs(120), window.acquire_many(all)).await??;
    let result = phase("publish", a.count, started, cpu0, a.pid);
    producer.close().await?;
    let failed = failed.load(std::sync::atomic::Ordering::Relaxed);
    anyhow::ensure!(failed == 0, "{failed} messages were not confirmed");
    Ok(result)
}

async fn read(env: &Environment, a: &Args, readers: usize) -> anyhow::Result<serde_json::Value> {
    let mut consumers = Vec::new();
    for _ in 0..readers {
        let c = env
            .consumer()
            .offset(OffsetSpecification::First)
            .build(&a.stream)
            .await?;
        consumers.push(c);
    }
    let cpu0 = cpu_us(a.pid);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for mut c in consumers {
        let want = a.count;
        tasks.push(tokio::spawn(async move {
            let mut got = 0u64;
            while got < want {
                match tokio::time::timeout(Duration::from_secs(30), c.next()).await {
                    Ok(Some(Ok(_))) => got += 1,
                    Ok(Some(Err(e))) => anyhow::bail!("delivery: {e:?}"),
                    Ok(None) => anyhow::bail!("the consumer ended after {got}"),
                    Err(_) => anyhow::bail!("nothing for 30 s after {got}"),
                }
            }
            let _ = c.handle().close().await;
            Ok(got)
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    Ok(phase(
        &format!("read x{readers}"),
        total,
        started,
        cpu0,
        a.pid,
    ))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let env = Environment::builder()
        .host(&a.host)
        .port(a.port)
        .build()
        .await
        .map_err(|e| anyhow::anyhow!("connect: {e:?}"))?;
    let _ = env.delete_stream(&a.stream).await;
    env.stream_creator()
        .max_length(ByteCapacity::GB(20))
        .create(&a.stream)
        .await
        .map_err(|e| anyhow::anyhow!("create: {e:?}"))?;
    let mut out = serde_json::Map::new();
    out.insert("size".into(), a.size.into());
    out.insert("batch".into(), a.batch.into());
    out.insert("publish".into(), publish(&env, &a).await?);
    for r in a.readers.split(',').filter(|r| !r.is_empty()) {
        let n: usize = r.trim().parse()?;
        out.insert(format!("read{n}"), read(&env, &a, n).await?);
    }
    if !a.keep {
        env.delete_stream(&a.stream)
            .await
            .map_err(|e| anyhow::anyhow!("delete: {e:?}"))?;
    }
    println!("{}", serde_json::Value::Object(out));
    Ok(())
}
