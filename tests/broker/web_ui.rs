//! The management web UI in a real browser: headless Chromium driven
//! through chromedriver (WebDriver). It logs in, sees a queue's depth
//! change after publishing (the page polls; no reload), declares a queue
//! and an exchange, binds them, publishes through the UI, gets the
//! message, moves messages between queues, purges, deletes, adds a user
//! with a permission, and a monitoring user is refused a change.
//! Screenshots go to target/ui-screenshots/ (CI keeps them).
//!
//! Needs `chromium` and `chromedriver` (Debian's chromium and
//! chromium-driver; .ci/run installs them and sets
//! WARREN_REQUIRE_BROWSER, so there it cannot skip); elsewhere without
//! them the test says it is skipped and passes. WARREN_UI_BROWSER=firefox
//! runs it in Firefox instead (`firefox` or `firefox-esr`, and
//! `geckodriver`, on the PATH).

use crate::common;
use crate::helpers;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use fantoccini::{Client, ClientBuilder, Locator};
use lapin::options::*;
use lapin::types::FieldTable;
use lapin::Channel;

/// How long the UI may take to show something (it polls every 5 s).
const PATIENCE: Duration = Duration::from_secs(30);

/// chromedriver on a free port, stopped on drop.
struct Driver {
    child: Child,
    port: u16,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
}

fn firefox() -> bool {
    std::env::var("WARREN_UI_BROWSER").is_ok_and(|b| b == "firefox")
}

fn driver() -> Option<Driver> {
    let port = child::free_port();
    let mut cmd = if firefox() {
        if !on_path("geckodriver") || !(on_path("firefox") || on_path("firefox-esr")) {
            return None;
        }
        let mut c = Command::new("geckodriver");
        c.arg("--port").arg(port.to_string());
        c
    } else {
        if !on_path("chromedriver") || !on_path("chromium") {
            return None;
        }
        let mut c = Command::new("chromedriver");
        c.arg(format!("--port={port}"));
        c
    };
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    Some(Driver { child, port })
}

async fn browser(d: &Driver) -> Client {
    let mut caps = serde_json::Map::new();
    if firefox() {
        let binary = if on_path("firefox") {
            "firefox"
        } else {
            "firefox-esr"
        };
        caps.insert(
            "moz:firefoxOptions".into(),
            serde_json::json!({
                "binary": binary,
                "args": ["-headless", "-width", "1280", "-height", "900"],
            }),
        );
    } else {
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1280,900"],
            }),
        );
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        match ClientBuilder::new(connector)
            .capabilities(caps.clone())
            .connect(&format!("http://127.0.0.1:{}", d.port))
            .await
        {
            Ok(c) => return c,
            Err(e) if Instant::now() > deadline => panic!("chromedriver: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Waits until the element at `css` has text for which `ok` holds.
async fn wait_text(c: &Client, css: &str, ok: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + PATIENCE;
    let mut last = String::new();
    loop {
        if let Ok(el) = c.find(Locator::Css(css)).await {
            if let Ok(t) = el.text().await {
                if ok(&t) {
                    return t;
                }
                last = t;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{css} never showed what was expected; last: {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until some flash message contains `text`, and checks that a
/// click where it shows reaches the page under it: a flash never stands
/// between the user and a button.
async fn flashed(c: &Client, text: &str) {
    wait_text(c, "#flash", |t| t.contains(text)).await;
    let hit = c
        .execute(
            "const f = document.getElementById('flash');
             const m = f.lastElementChild;
             if (!m) return 'gone';
             const r = m.getBoundingClientRect();
             const e = document.elementFromPoint(r.x + r.width / 2, r.y + r.height / 2);
             return f.contains(e) ? 'flash' : 'page';",
            vec![],
        )
        .await
        .expect("run the hit test");
    assert_ne!(hit, "flash", "the flash {text:?} takes the clicks under it");
}

/// Fills form `id`'s fields and submits it.
async fn submit(c: &Client, id: &str, fields: &[(&str, &str)]) {
    let css = format!("form[data-form='{id}']");
    let deadline = Instant::now() + PATIENCE;
    let form = loop {
        match c.form(Locator::Css(&css)).await {
            Ok(f) => break f,
            Err(e) => assert!(Instant::now() < deadline, "no form {id}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for (name, value) in fields {
        form.set_by_name(name, value).await.expect("field");
    }
    form.submit().await.expect("submit");
}

async fn go(c: &Client, base: &str, hash: &str) {
    c.goto(&format!("{base}/{hash}")).await.expect("navigate");
}

/// Clicks the button labelled `label` and accepts its confirm dialog.
async fn click_confirmed(c: &Client, label: &str) {
    let xpath = format!("//button[normalize-space()='{label}']");
    let b = c
        .wait()
        .at_most(PATIENCE)
        .for_element(Locator::XPath(&xpath))
        .await
        .expect("button");
    b.click().await.expect("click");
    let deadline = Instant::now() + PATIENCE;
    while c.accept_alert().await.is_err() {
        assert!(Instant::now() < deadline, "no confirm dialog");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn shot(c: &Client, name: &str) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/ui-screenshots");
    let _ = std::fs::create_dir_all(&dir);
    if let Ok(png) = c.screenshot().await {
        let _ = std::fs::write(dir.join(format!("{name}.png")), png);
    }
}

async fn login(c: &Client, base: &str, user: &str, password: &str) {
    go(c, base, "").await;
    submit_login(c, user, password).await;
    wait_text(c, "#who", |t| t.contains(user)).await;
}

async fn submit_login(c: &Client, user: &str, password: &str) {
    c.wait()
        .at_most(PATIENCE)
        .for_element(Locator::Css("form#login"))
        .await
        .expect("the login form");
    let f = c.form(Locator::Css("form#login")).await.unwrap();
    f.set_by_name("username", user).await.unwrap();
    f.set_by_name("password", password).await.unwrap();
    f.submit().await.unwrap();
}

async fn publish(ch: &Channel, queue: &str, n: usize) {
    for i in 0..n {
        ch.basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            format!("m{i}").as_bytes(),
            helpers::persistent(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    }
}

/// `queue`'s depth, or None if there is no such queue.
/// Declares super stream `name` with `n` partitions as RabbitMQ's
/// clients do over AMQP: a direct exchange with `x-super-stream`, a stream
/// per partition, each bound by its index (the last first).
async fn super_stream(ch: &Channel, name: &str, n: u32) {
    use lapin::types::AMQPValue;
    let arg = |k: &str, v: AMQPValue| {
        let mut t = FieldTable::default();
        t.insert(k.into(), v);
        t
    };
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    let super_stream = arg("x-super-stream", AMQPValue::Boolean(true));
    ch.exchange_declare(
        name.into(),
        lapin::ExchangeKind::Direct,
        durable,
        super_stream,
    )
    .await
    .unwrap();
    for i in (0..n).rev() {
        let partition = format!("{name}-{i}");
        let stream = arg("x-queue-type", AMQPValue::LongString("stream".into()));
        let options = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        ch.queue_declare(partition.as_str().into(), options, stream)
            .await
            .unwrap();
        let order = arg("x-stream-partition-order", AMQPValue::LongInt(i as i32));
        let key = i.to_string();
        ch.queue_bind(
            partition.as_str().into(),
            name.into(),
            key.as_str().into(),
            QueueBindOptions::default(),
            order,
        )
        .await
        .unwrap();
    }
}

async fn depth(conn: &lapin::Connection, queue: &str) -> Option<u32> {
    if !helpers::queue_exists(conn, queue).await {
        return None;
    }
    let ch = conn.create_channel().await.ok()?;
    Some(helpers::message_count(&ch, queue).await)
}

/// Waits until `f` says yes (an AMQP check of what the UI did).
async fn until<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + PATIENCE;
    while !f().await {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ui_manages_the_broker_in_a_real_browser() {
    let Some(d) = driver() else {
        assert!(
            std::env::var_os("WARREN_REQUIRE_BROWSER").is_none(),
            "chromium and chromedriver are needed"
        );
        eprintln!("skipped: chromium and chromedriver are not installed");
        return;
    };
    let b = start_with_api().await;
    // The API listens on every address; browsers are pointed at loopback
    // (Firefox refuses 0.0.0.0).
    let base = format!("http://127.0.0.1:{}", b.api.expect("API").port());
    let conn = b.connect().await;
    let amqp = conn.create_channel().await.unwrap();
    amqp.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    amqp.queue_declare(
        "orders".into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    publish(&amqp, "orders", 3).await;

    let c = browser(&d).await;
    // A wrong password is refused on the page, not by a browser dialog.
    go(&c, &base, "").await;
    submit_login(&c, "guest", "wrong").await;
    wait_text(&c, "form#login", |t| t.contains("Login failed")).await;
    login(&c, &base, "guest", "guest").await;
    wait_text(&c, "h1", |t| t == "Overview").await;
    wait_text(&c, ".cards", |t| t.contains("Queues")).await;
    shot(&c, "overview").await;

    // The queue's page shows its depth, and follows it without a reload.
    go(&c, &base, "#/queues/%2F/orders").await;
    wait_text(&c, "[data-depth='Total']", |t| t == "3").await;
    publish(&amqp, "orders", 2).await;
    wait_text(&c, "[data-depth='Total']", |t| t == "5").await;
    shot(&c, "queue").await;

    // Declare a queue and an exchange, bind them.
    go(&c, &base, "#/queues").await;
    submit(&c, "add-queue", &[("name", "from-ui"), ("durable", "true")]).await;
    flashed(&c, "Queue from-ui declared").await;
    wait_text(&c, ".paged table", |t| t.contains("from-ui")).await;
    shot(&c, "queues").await;
    go(&c, &base, "#/exchanges").await;
    submit(&c, "add-exchange", &[("name", "ui-x"), ("type", "direct")]).await;
    flashed(&c, "Exchange ui-x declared").await;
    go(&c, &base, "#/exchanges/%2F/ui-x").await;
    submit(
        &c,
        "bind",
        &[
            ("kind", "q"),
            ("destination", "from-ui"),
            ("routing_key", "k"),
        ],
    )
    .await;
    flashed(&c, "Bound").await;
    wait_text(&c, "main", |t| {
        t.contains("Bindings from here") && t.contains("from-ui")
    })
    .await;

    // Publish through the UI, then get it on the queue's page.
    submit(
        &c,
        "publish",
        &[("routing_key", "k"), ("payload", "hello from the browser")],
    )
    .await;
    flashed(&c, "Message published").await;
    go(&c, &base, "#/queues/%2F/from-ui").await;
    submit(
        &c,
        "get",
        &[("ackmode", "ack_requeue_true"), ("count", "1")],
    )
    .await;
    wait_text(&c, "pre.payload", |t| t == "hello from the browser").await;

    // Move two of the orders into it.
    go(&c, &base, "#/queues/%2F/orders").await;
    submit(&c, "move", &[("destination", "from-ui"), ("count", "2")]).await;
    flashed(&c, "Moved 2 messages to from-ui").await;
    until("the move reached the queues", || async {
        depth(&conn, "orders").await == Some(3) && depth(&conn, "from-ui").await == Some(3)
    })
    .await;

    // A stream declared in the UI, read from an offset on its page
    // (which moves and removes nothing: the same read twice).
    go(&c, &base, "#/queues").await;
    submit(
        &c,
        "add-queue",
        &[
            ("name", "ui-stream"),
            ("type", "stream"),
            ("durable", "true"),
        ],
    )
    .await;
    flashed(&c, "Queue ui-stream declared").await;
    publish(&amqp, "ui-stream", 4).await;
    go(&c, &base, "#/queues/%2F/ui-stream").await;
    wait_text(&c, "main", |t| {
        t.contains("Segments") && t.contains("Last offset")
    })
    .await;
    for _ in 0..2 {
        submit(&c, "read", &[("offset", "2"), ("count", "10")]).await;
        wait_text(&c, "div.message h3", |t| t == "Offset 2").await;
        wait_text(&c, "main", |t| {
            t.contains("m2") && t.contains("m3") && !t.contains("m1\n")
        })
        .await;
    }
    shot(&c, "stream").await;
    assert_eq!(depth(&conn, "ui-stream").await, Some(4));

    // A super stream (declared over AMQP: the exchange, its partitions
    // bound out of order) shows its partitions in order on its page.
    super_stream(&amqp, "invoices", 2).await;
    go(&c, &base, "#/exchanges/%2F/invoices").await;
    let text = wait_text(&c, "main", |t| {
        t.contains("Super stream partitions") && t.contains("invoices-1")
    })
    .await;
    assert!(text.contains("direct (super stream)"), "{text}");
    let at = |s: &str| text.find(s).unwrap_or(usize::MAX);
    assert!(
        at("invoices-0") < at("invoices-1"),
        "in partition order: {text}"
    );
    shot(&c, "super-stream").await;

    // Purge it, then delete it.
    go(&c, &base, "#/queues/%2F/from-ui").await;
    wait_text(&c, "[data-depth='Total']", |t| t == "3").await;
    click_confirmed(&c, "Purge messages").await;
    flashed(&c, "Queue purged").await;
    until("purged", || async {
        depth(&conn, "from-ui").await == Some(0)
    })
    .await;
    click_confirmed(&c, "Delete queue").await;
    flashed(&c, "Queue deleted").await;
    until("deleted", || async {
        depth(&conn, "from-ui").await.is_none()
    })
    .await;

    // Definitions uploaded from the overview add their vhost.
    let defs = std::env::temp_dir().join(format!("warren-ui-defs-{}.json", std::process::id()));
    std::fs::write(&defs, r#"{"vhosts": [{"name": "from-file"}]}"#).unwrap();
    go(&c, &base, "").await;
    let file = c
        .wait()
        .at_most(PATIENCE)
        .for_element(Locator::Css("input[name='definitions']"))
        .await
        .expect("the definitions file input");
    file.send_keys(&defs.display().to_string()).await.unwrap();
    c.find(Locator::XPath("//button[normalize-space()='Upload']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    flashed(&c, "Definitions imported").await;
    let _ = std::fs::remove_file(&defs);
    go(&c, &base, "#/admin/vhosts").await;
    wait_text(&c, "main", |t| t.contains("from-file")).await;

    // The test's own AMQP connection is listed; its page force-closes it.
    go(&c, &base, "#/connections").await;
    c.wait()
        .at_most(PATIENCE)
        .for_element(Locator::Css(".paged tbody a"))
        .await
        .expect("a connection")
        .click()
        .await
        .unwrap();
    wait_text(&c, "main", |t| {
        t.contains("Channels") && t.contains("guest")
    })
    .await;
    c.find(Locator::XPath("//button[normalize-space()='Force close']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    flashed(&c, "Connection closed").await;
    until("the connection was closed", || async {
        !conn.status().connected()
    })
    .await;
    let conn = b.connect().await;

    // Admin › Shovels: the form makes a shovel that moves a queue; the
    // table shows it running; it pauses, resumes and goes.
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.queue_declare("ui-src".into(), durable, FieldTable::default())
        .await
        .unwrap();
    publish(&ch, "ui-src", 20).await;
    go(&c, &base, "#/admin/shovels").await;
    submit(
        &c,
        "add-shovel",
        &[
            ("vhost", "/"),
            ("name", "ui-move"),
            ("src_uri", "amqp://guest:guest@/%2F"),
            ("src", "ui-src"),
            ("dest_uri", "amqp://guest:guest@/%2F"),
            ("dest", "ui-dst"),
        ],
    )
    .await;
    flashed(&c, "Shovel ui-move added").await;
    wait_text(&c, "main", |t| {
        t.contains("ui-move") && t.contains("running")
    })
    .await;
    until("the shovel moved the queue", || async {
        depth(&conn, "ui-dst").await == Some(20)
    })
    .await;
    shot(&c, "shovels").await;
    for (button, shows) in [("Pause", "paused"), ("Resume", "running")] {
        let xpath = format!("//button[normalize-space()='{button}']");
        c.wait()
            .at_most(PATIENCE)
            .for_element(Locator::XPath(&xpath))
            .await
            .expect("the button")
            .click()
            .await
            .unwrap();
        wait_text(&c, "main", |t| t.contains(shows)).await;
    }
    click_confirmed(&c, "Delete").await;
    flashed(&c, "Shovel ui-move deleted").await;
    wait_text(&c, "main", |t| t.contains("No shovels.")).await;

    // Admin › Federation: an upstream made with the form (this broker,
    // another exchange), a policy that federates an exchange from it, the
    // link running and restarted, then the upstream deleted.
    ch.exchange_declare(
        "ui-fed".into(),
        lapin::ExchangeKind::Fanout,
        ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    go(&c, &base, "#/admin/federation").await;
    let uri = b.uri();
    submit(
        &c,
        "add-upstream",
        &[
            ("vhost", "/"),
            ("name", "ui-up"),
            ("uri", uri.as_str()),
            ("exchange", "ui-upx"),
        ],
    )
    .await;
    flashed(&c, "Upstream ui-up added").await;
    go(&c, &base, "#/admin/policies").await;
    submit(
        &c,
        "add-policy",
        &[
            ("vhost", "/"),
            ("name", "ui-fed"),
            ("pattern", "^ui-fed$"),
            ("apply_to", "exchanges"),
            ("definition", "federation-upstream=ui-up"),
        ],
    )
    .await;
    flashed(&c, "Policy ui-fed set").await;
    go(&c, &base, "#/admin/federation").await;
    wait_text(&c, "main", |t| {
        t.contains("exchange ui-fed") && t.contains("running")
    })
    .await;
    shot(&c, "federation").await;
    let restart = c
        .wait()
        .at_most(PATIENCE)
        .for_element(Locator::XPath("//button[normalize-space()='Restart']"))
        .await
        .expect("the Restart button");
    restart.click().await.unwrap();
    flashed(&c, "restarted").await;
    wait_text(&c, "main", |t| t.contains("running")).await;
    click_confirmed(&c, "Delete").await;
    flashed(&c, "Upstream ui-up deleted").await;
    wait_text(&c, "main", |t| t.contains("No federation links.")).await;

    // A user with a permission, and a monitoring user.
    go(&c, &base, "#/admin/users").await;
    submit(
        &c,
        "add-user",
        &[
            ("name", "ops"),
            ("password", "ops-pw"),
            ("tags", "management"),
        ],
    )
    .await;
    flashed(&c, "User ops added").await;
    go(&c, &base, "#/admin/users/ops").await;
    submit(
        &c,
        "set-permission",
        &[
            ("vhost", "/"),
            ("configure", "^ops-"),
            ("write", ".*"),
            ("read", ".*"),
        ],
    )
    .await;
    flashed(&c, "Permission set").await;
    wait_text(&c, "main", |t| t.contains("^ops-")).await;
    shot(&c, "user").await;
    go(&c, &base, "#/admin/users").await;
    submit(
        &c,
        "add-user",
        &[
            ("name", "watcher"),
            ("password", "watcher-pw"),
            ("tags", "monitoring"),
        ],
    )
    .await;
    flashed(&c, "User watcher added").await;
    // A blank password makes a user without one (certificate login only),
    // never one whose password is blank.
    go(&c, &base, "#/admin/users").await;
    submit(
        &c,
        "add-user",
        &[("name", "certonly"), ("password", ""), ("tags", "")],
    )
    .await;
    flashed(&c, "User certonly added without a password").await;
    let certonly = b
        .server
        .as_ref()
        .expect("running")
        .broker
        .users
        .get("certonly");
    assert_eq!(certonly.map(|u| u.password_hash.is_empty()), Some(true));

    // The monitoring user sees, but may not change.
    let logout = c
        .find(Locator::XPath("//button[normalize-space()='Log out']"))
        .await
        .unwrap();
    logout.click().await.unwrap();
    login(&c, &base, "watcher", "watcher-pw").await;
    go(&c, &base, "#/queues").await;
    wait_text(&c, ".paged table", |t| t.contains("orders")).await;
    submit(&c, "add-queue", &[("name", "not-allowed")]).await;
    flashed(&c, "401").await;
    shot(&c, "refused").await;
    assert_eq!(depth(&conn, "not-allowed").await, None);

    c.close().await.unwrap();
}
