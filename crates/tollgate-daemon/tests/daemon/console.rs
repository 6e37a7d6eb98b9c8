//! The console in a real browser: headless Chromium driven by chromedriver over WebDriver
//! (a minimal client over HTTP below; nothing is downloaded). An agent's call is held; an
//! operator opens the console, signs in, sees the call and its arguments, edits them,
//! writes a note and approves the edited call; the waiting agent receives exactly the
//! edited arguments, they run, and the audit log names the operator.
//!
//! Without `chromium` and `chromedriver` on the PATH the test says so and passes, unless
//! `TOLLGATE_REQUIRE_CHROMIUM=1` (set by `.ci/run`), which makes their absence a failure.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tollgate_core::json as tjson;
use tollgate_proto::sp1::{self, envelope::Payload};

use crate::control::{agent_request, control_config, digest, held_call, ALICE};
use crate::{session_events, start, Running, SECRET};

fn on_path(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    names.iter().find_map(|n| {
        std::env::split_paths(&path)
            .map(|d| d.join(n))
            .find(|p| p.is_file())
    })
}

/// chromedriver, killed when dropped.
struct Driver {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One WebDriver command: method, path, body; the reply's `value`.
async fn wd(addr: SocketAddr, method: &str, path: &str, body: Option<Value>) -> Value {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    // Read the head, then Content-Length bytes (chromedriver may keep the connection open).
    let read = async {
        let mut out = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            let n = s.read(&mut buf).await.unwrap();
            out.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&out).into_owned();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let len = head.lines().find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                });
                if n == 0 || len.is_some_and(|len| body.len() >= len) {
                    return text;
                }
            }
            if n == 0 {
                return text;
            }
        }
    };
    let text = tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .expect("chromedriver did not answer within 60 s");
    let (_, json_body) = text.split_once("\r\n\r\n").unwrap_or(("", ""));
    let v: Value = serde_json::from_str(json_body)
        .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {text}"));
    if let Some(err) = v["value"].get("error") {
        panic!("{method} {path}: {err}: {}", v["value"]["message"]);
    }
    v["value"].clone()
}

struct Browser {
    driver: Driver,
    session: String,
}

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

impl Browser {
    async fn start(chromium: &Path, chromedriver: &Path, logs: &Path) -> Browser {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .arg(format!(
                "--log-path={}",
                logs.join("chromedriver.log").display()
            ))
            .arg("--enable-chrome-logs")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let driver = Driver {
            child,
            addr: ([127, 0, 0, 1], port).into(),
        };
        // Ready within 30 s.
        let mut ready = false;
        for _ in 0..300 {
            if TcpStream::connect(driver.addr).await.is_ok() {
                ready = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(ready, "chromedriver did not start");
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium.display().to_string(),
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1280,800"]
            }
        }}});
        let v = wd(driver.addr, "POST", "/session", Some(caps)).await;
        let session = v["sessionId"].as_str().unwrap().to_owned();
        let b = Browser { driver, session };
        // The page area itself is 1280 x 800, whatever the window's decorations take.
        b.post(
            "goog/cdp/execute",
            json!({"cmd": "Emulation.setDeviceMetricsOverride",
                   "params": {"width": 1280, "height": 800, "deviceScaleFactor": 1, "mobile": false}}),
        )
        .await;
        b
    }

    async fn post(&self, what: &str, body: Value) -> Value {
        wd(
            self.driver.addr,
            "POST",
            &format!("/session/{}/{what}", self.session),
            Some(body),
        )
        .await
    }

    async fn get(&self, what: &str) -> Value {
        wd(
            self.driver.addr,
            "GET",
            &format!("/session/{}/{what}", self.session),
            None,
        )
        .await
    }

    async fn js(&self, script: &str, args: Value) -> Value {
        self.post("execute/sync", json!({"script": script, "args": args}))
            .await
    }

    /// Poll `script` (a JS function body returning a value) until it is truthy, at most 30 s.
    async fn until(&self, what: &str, script: &str, args: Value) -> Value {
        for _ in 0..300 {
            let v = self.js(script, args.clone()).await;
            if !(v.is_null() || v == json!(false) || v == json!("")) {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("gave up waiting for {what}");
    }

    async fn find(&self, css: &str) -> String {
        let v = self
            .post("element", json!({"using": "css selector", "value": css}))
            .await;
        v[ELEMENT].as_str().unwrap().to_owned()
    }

    async fn type_into(&self, css: &str, text: &str) {
        let e = self.find(css).await;
        self.post(&format!("element/{e}/value"), json!({ "text": text }))
            .await;
    }

    async fn clear(&self, css: &str) {
        let e = self.find(css).await;
        self.post(&format!("element/{e}/clear"), json!({})).await;
    }

    async fn click(&self, css: &str) {
        let e = self.find(css).await;
        self.post(&format!("element/{e}/click"), json!({})).await;
    }

    /// Key presses sent to whatever has the focus, as a user types them (WebDriver
    /// actions: the caret stays where the page has it).
    async fn keys(&self, text: &str) {
        let mut actions = Vec::new();
        for ch in text.chars() {
            actions.push(json!({"type": "keyDown", "value": ch.to_string()}));
            actions.push(json!({"type": "keyUp", "value": ch.to_string()}));
        }
        self.post(
            "actions",
            json!({"actions": [{"type": "key", "id": "keyboard", "actions": actions}]}),
        )
        .await;
    }

    /// Open the console at `addr` and sign in as `token`, with the keyboard.
    async fn sign_in(&self, addr: SocketAddr, token: &str) {
        self.post("url", json!({"url": format!("http://{addr}/")}))
            .await;
        self.type_into("#token", &format!("{token}\u{E007}")).await;
        self.until(
            "the signed-in operator",
            "return document.getElementById('status').textContent === 'live'",
            json!([]),
        )
        .await;
    }

    async fn screenshot(&self, to: &Path) {
        let b64 = self.get("screenshot").await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(b64.as_str().unwrap())
            .unwrap();
        assert!(png.starts_with(b"\x89PNG"));
        std::fs::write(to, png).unwrap();
    }

    async fn close(self) {
        let _ = wd(
            self.driver.addr,
            "DELETE",
            &format!("/session/{}", self.session),
            None,
        )
        .await;
    }
}

/// Chromium and chromedriver, or `None` (the test is skipped) when they are not on the
/// PATH, unless `TOLLGATE_REQUIRE_CHROMIUM=1`.
fn browser_binaries() -> Option<(PathBuf, PathBuf)> {
    let required = std::env::var("TOLLGATE_REQUIRE_CHROMIUM").is_ok_and(|v| v == "1");
    let (Some(chromium), Some(chromedriver)) = (
        on_path(&["chromium", "chromium-browser", "google-chrome"]),
        on_path(&["chromedriver"]),
    ) else {
        assert!(
            !required,
            "TOLLGATE_REQUIRE_CHROMIUM=1 but chromium or chromedriver is not on the PATH \
             (Debian: apt-get install chromium chromium-driver)"
        );
        eprintln!("skipped: chromium and chromedriver are not on the PATH (apt-get install chromium chromium-driver)");
        return None;
    };
    Some((chromium, chromedriver))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_edits_and_approves_a_held_call_in_the_browser() {
    let Some((chromium, chromedriver)) = browser_binaries() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // A fixed port, so that the page can reconnect to the restarted daemon.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let configured = || {
        let mut c = control_config(dir.path());
        if let Some(ctl) = c.control.as_mut() {
            ctl.listen = ([127, 0, 0, 1], port).into();
        }
        c
    };
    let d = start(configured()).await;
    let addr = d.control.unwrap();

    // An agent's call is held, and the agent shows its arguments.
    let original = r#"{"service":"api","replicas":30,"region":"eu-west-1"}"#;
    let (agent, _) = held_call(&d, original, true).await;
    let sid = agent.session_id().to_owned();

    let b = Browser::start(&chromium, &chromedriver, dir.path()).await;
    b.post("url", json!({"url": format!("http://{addr}/")}))
        .await;
    // Sign in with the keyboard: the token, then Enter.
    b.type_into("#token", &format!("{ALICE}\u{E007}")).await;
    b.until(
        "the signed-in operator",
        "return document.getElementById('who').textContent.includes('alice')",
        json!([]),
    )
    .await;
    let card = format!(".card[data-session=\"{sid}\"]");
    let args_shown = "const c = document.querySelector(arguments[0]); \
                      return c && c.querySelector('textarea.args').value";
    b.until("the held call's arguments", args_shown, json!([card]))
        .await;

    // The daemon restarts under the open page: the page says so, reconnects by itself, and
    // shows the truth: the call is still held, but its arguments (kept in memory only) are
    // not known until the agent sends them again; the hash is shown instead.
    drop(agent);
    d.stop().await;
    b.until(
        "the page to notice the daemon is gone",
        "return document.getElementById('status').textContent.includes('reconnecting')",
        json!([]),
    )
    .await;
    let d = start(configured()).await;
    let hash_only = b
        .until(
            "the held call, by hash, after the restart",
            "const c = document.querySelector(arguments[0]); \
             return c && c.querySelector('.unknown') && c.querySelector('.digest').textContent",
            json!([card]),
        )
        .await;
    let p = tjson::parse_str(original).unwrap();
    let hex: String = digest(&p).iter().map(|x| format!("{x:02x}")).collect();
    assert_eq!(hash_only, json!(hex));
    b.until(
        "the sessions table after the restart",
        "return document.getElementById('sessions').innerText.includes(arguments[0])",
        json!([&sid[..16]]),
    )
    .await;
    let restarted = dir.path().join("console-restarted.png");
    b.screenshot(&restarted).await;
    let resent = agent_request(
        &d.socket,
        SECRET,
        Payload::HeldParams(sp1::HeldParams {
            session_id: sid.clone(),
            call_number: 1,
            params_json: original.into(),
        }),
    )
    .await;
    assert!(matches!(resent, Payload::HeldParamsAck(_)), "{resent:?}");
    // The held call, with its arguments pretty-printed, pushed to the page.
    let shown = b
        .until("the held call's arguments again", args_shown, json!([card]))
        .await;
    assert_eq!(
        shown.as_str().unwrap(),
        "{\n  \"region\": \"eu-west-1\",\n  \"replicas\": 30,\n  \"service\": \"api\"\n}"
    );
    let text = b
        .js(
            "return document.querySelector(arguments[0]).innerText",
            json!([card]),
        )
        .await;
    let text = text.as_str().unwrap();
    for want in [
        "deploy",
        "reviewed",
        "acme",
        "hitl_all_calls",
        "$0.2500",
        "$10.0000",
        "left",
    ] {
        assert!(text.contains(want), "the card lacks `{want}`:\n{text}");
    }
    // The sessions table shows the paused session with its budget and circuit.
    let sessions = b
        .until(
            "the sessions table",
            "const t = document.getElementById('sessions').innerText; return t.includes(arguments[0]) && t",
            json!([&sid[..16]]),
        )
        .await;
    let sessions = sessions.as_str().unwrap();
    assert!(
        sessions.contains("paused") && sessions.contains("closed"),
        "{sessions}"
    );

    // Edit the arguments, write a note, approve the edited call.
    let edited = "{\n  \"region\": \"eu-west-1\",\n  \"replicas\": 3,\n  \"service\": \"api\"\n}";
    b.clear(&format!("{card} textarea.args")).await;
    b.type_into(&format!("{card} textarea.args"), edited).await;
    b.type_into(
        &format!("{card} input.note"),
        "30 replicas is a typo; 3 is the plan",
    )
    .await;
    let shots = dir.path().join("console-held.png");
    b.screenshot(&shots).await;
    b.click(&format!("{card} button[data-decision=modify]"))
        .await;
    // The call leaves the list (resolved push) and the decision is listed, by alice.
    b.until(
        "the decided call to leave the list",
        "return !document.querySelector(arguments[0])",
        json!([card]),
    )
    .await;
    let recent = b
        .until(
            "the decision in the history",
            "const t = document.getElementById('history').innerText; return t.includes('modify') && t",
            json!([]),
        )
        .await;
    assert!(
        recent.as_str().unwrap().contains("modify by alice"),
        "{recent}"
    );
    let after = dir.path().join("console-decided.png");
    b.screenshot(&after).await;
    b.close().await;

    // The waiting agent receives exactly the edited arguments, canonical, and they run.
    let waited = agent_request(
        &d.socket,
        SECRET,
        Payload::AwaitDecision(sp1::AwaitDecisionRequest {
            session_id: sid.clone(),
            call_number: 1,
            timeout_ms: 5000,
        }),
    )
    .await;
    let Payload::AwaitDecisionResponse(r) = waited else {
        panic!("{waited:?}")
    };
    assert_eq!(r.outcome, "modify");
    assert_eq!(
        r.successor_params_json,
        r#"{"region":"eu-west-1","replicas":3,"service":"api"}"#
    );
    let t = r.transition.unwrap();
    let successor = tjson::parse_str(&r.successor_params_json).unwrap();
    let run = agent_request(
        &d.socket,
        SECRET,
        Payload::PreExec(sp1::PreExecRequest {
            session_id: sid.clone(),
            call_number: 2,
            tool_name: "deploy".into(),
            tool_params_hash: digest(&successor),
            nonce: t.successor_nonce,
            ..Default::default()
        }),
    )
    .await;
    let Payload::PreExecResponse(v) = run else {
        panic!("{run:?}")
    };
    assert_eq!(
        (v.verdict, v.reason.as_str()),
        (
            sp1::Verdict::Allow as i32,
            "hitl_transition:modify_successor"
        )
    );
    // The audit log verifies, and its kind-6 entry names alice, with her note.
    let human: Vec<_> = session_events(&d.dir)
        .into_iter()
        .filter_map(|e| match e {
            tollgate_audit::SessionEvent::HumanDecision(h) => Some(h),
            _ => None,
        })
        .collect();
    assert_eq!(human.len(), 1);
    assert_eq!(human[0].operator_id, "alice");
    assert_eq!(human[0].note, "30 replicas is a typo; 3 is the plan");
    assert_eq!(human[0].decision.as_str(), "modify");
    d.stop().await;

    // Where the lead can look at it.
    let stable = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target");
    std::fs::create_dir_all(&stable).unwrap();
    std::fs::copy(&restarted, stable.join("console-screenshot-restarted.png")).unwrap();
    let held_png = stable.join("console-screenshot.png");
    let decided_png = stable.join("console-screenshot-decided.png");
    std::fs::copy(&shots, &held_png).unwrap();
    std::fs::copy(&after, &decided_png).unwrap();
    eprintln!(
        "console screenshots: {} (held, edited), {} (after the decision)",
        held_png.display(),
        decided_png.display()
    );
}

/// A free loopback port, for a control plane that must come back on the same address.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The control configuration in `dir` with the control plane on `port`.
fn configured(dir: &Path, port: u16) -> tollgate_daemon::DaemonConfig {
    let mut c = control_config(dir);
    if let Some(ctl) = c.control.as_mut() {
        ctl.listen = ([127, 0, 0, 1], port).into();
    }
    c
}

/// Hold call `call_number` (tool `deploy`, nonce `nonce`) of `agent`'s session (agent
/// `reviewed`: HITL always) and show operators its params.
async fn hold(
    d: &Running,
    agent: &tollgate_client::DaemonClient,
    call_number: u64,
    nonce: u64,
    params: &str,
) {
    let p = tjson::parse_str(params).unwrap();
    let v = agent
        .pre_exec_request(sp1::PreExecRequest {
            session_id: agent.session_id().to_owned(),
            call_number,
            tool_name: "deploy".into(),
            tool_params_hash: digest(&p),
            estimated_cost_usd: 0.25,
            nonce,
            ..Default::default()
        })
        .await;
    assert_eq!(v.verdict, tollgate_core::Verdict::Hitl, "{v:?}");
    assert_eq!(v.call_number, call_number, "{v:?}");
    let ack = agent_request(
        &d.socket,
        SECRET,
        Payload::HeldParams(sp1::HeldParams {
            session_id: agent.session_id().to_owned(),
            call_number,
            params_json: params.to_owned(),
        }),
    )
    .await;
    assert!(matches!(ack, Payload::HeldParamsAck(_)), "{ack:?}");
}

/// The CSS selector of the card of held call `call` of session `sid`.
fn card_of(sid: &str, call: u64) -> String {
    format!(".card[data-session=\"{sid}\"][data-call=\"{call}\"]")
}

/// The call numbers of the cards shown, and of those offering an enabled or disabled
/// decision button (Approve, Reject, Defer, Escalate, Approve edited), as JSON.
const CARDS: &str = "return Array.from(document.querySelectorAll('#held .card')).map((c) => \
     ({ call: c.dataset.call, session: c.dataset.session, \
        buttons: c.querySelectorAll('button.decide').length, \
        text: c.innerText }))";

/// The held calls of the organization over the socket, by call number.
async fn listed(socket: &Path) -> Vec<u64> {
    let op = crate::operator(socket).await;
    let mut calls: Vec<u64> = op
        .hitl_list()
        .await
        .unwrap()
        .iter()
        .map(|p| p.transition.as_ref().unwrap().call_number)
        .collect();
    calls.sort_unstable();
    calls
}

/// Issue 16 §4: a call decided with `tollgate hitl decide` (an operator over the socket,
/// as the CLI does) is never offered decision buttons again: not live on the open page, not
/// after a reload, not after a daemon restart; the page says who decided it; a fresh
/// `hitl_list` lists only the call still waiting, before and after the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_decided_elsewhere_is_never_offered_again_after_a_reload_or_a_restart() {
    let Some((chromium, chromedriver)) = browser_binaries() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let d = start(configured(dir.path(), port)).await;
    let addr = d.control.unwrap();

    // Four parallel calls of one session, all held.
    let agent = crate::connect(&d.socket, "reviewed").await;
    let sid = agent.session_id().to_owned();
    for n in 1..=5u64 {
        hold(&d, &agent, n, 1000 + n, &format!(r#"{{"i":{n}}}"#)).await;
    }
    let b = Browser::start(&chromium, &chromedriver, dir.path()).await;
    b.sign_in(addr, ALICE).await;
    b.until(
        "a card for each of the five held calls of the session",
        "return [1,2,3,4,5].every((n) => document.querySelector(arguments[0] + '[data-call=\"' + n + '\"]'))",
        json!([format!(".card[data-session=\"{sid}\"]")]),
    )
    .await;
    // Alice starts working on call 2: a note typed, not sent.
    b.type_into(&format!("{} input.note", card_of(&sid, 2)), "looking")
        .await;

    // bob decides calls 1 to 3 from the command line.
    let cli = operator_as(&d.socket).await;
    for (n, word) in [(1u64, "approve"), (2, "reject"), (3, "modify")] {
        decide(&cli, &sid, n, word).await;
    }
    assert_eq!(
        listed(&d.socket).await,
        vec![4, 5],
        "hitl_list after the decisions"
    );

    // Live: calls 1 and 3 leave; call 2, which alice was working on, stays on screen as
    // decided, saying by whom, with no decision button; calls 4 and 5 are still offered.
    let live = b
        .until(
            "calls 1 and 3 to leave and call 2 to show bob's reject",
            &format!(
                "const cards = (function () {{ {CARDS} }})(); \
                 const two = cards.find((c) => c.call === '2'); \
                 return cards.length === 3 && two && two.buttons === 0 \
                 && two.text.includes('cli-bob') && cards"
            ),
            json!([]),
        )
        .await;
    assert!(
        live.to_string().contains("Rejected by cli-bob"),
        "the decided card says who decided: {live}"
    );
    let stable = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target");
    std::fs::create_dir_all(&stable).unwrap();
    b.screenshot(&stable.join("console-screenshot-decided-elsewhere.png"))
        .await;
    // Dismissed, it leaves.
    b.click(&format!("{} button.dismiss", card_of(&sid, 2)))
        .await;
    b.until(
        "the dismissed card to leave",
        "return !document.querySelector(arguments[0])",
        json!([card_of(&sid, 2)]),
    )
    .await;
    for n in ["4", "5"] {
        let c = live
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["call"] == n)
            .unwrap_or_else(|| panic!("call {n} is not shown: {live}"));
        assert_eq!(c["buttons"], 5, "{live}");
    }

    // A reload: only calls 4 and 5 are offered; the recent decisions say who decided the
    // others.
    b.sign_in(addr, ALICE).await;
    b.until(
        "calls 4 and 5",
        "return document.querySelector(arguments[0]) && document.querySelector(arguments[1])",
        json!([card_of(&sid, 4), card_of(&sid, 5)]),
    )
    .await;
    let recent = b
        .until(
            "the decisions in the history",
            "const t = document.getElementById('history').innerText; return t.includes('modify') && t",
            json!([]),
        )
        .await;
    for want in [
        "approve by cli-bob",
        "reject by cli-bob",
        "modify by cli-bob",
    ] {
        assert!(recent.as_str().unwrap().contains(want), "{recent}");
    }
    let shown = b.js(CARDS, json!([])).await;
    let calls: Vec<(String, u64)> = shown
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["call"].as_str().unwrap().to_owned(),
                c["buttons"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        calls,
        vec![("4".to_owned(), 5), ("5".to_owned(), 5)],
        "after a reload: {shown}"
    );
    // Alice defers call 5 from the page (two calls wait: the page names the call). It stays
    // offered, saying who deferred it: a deferred call still waits for a decision.
    let five = card_of(&sid, 5);
    b.type_into(&format!("{five} input.note"), "ask finance first")
        .await;
    b.click(&format!("{five} button[data-decision=defer]"))
        .await;
    b.until(
        "call 5 deferred by alice, still offered",
        "const c = document.querySelector(arguments[0]); \
         return c && c.innerText.includes('deferred by alice') \
         && c.querySelectorAll('button.decide').length === 5 && c.innerText",
        json!([five]),
    )
    .await;
    assert_eq!(
        listed(&d.socket).await,
        vec![4, 5],
        "a deferred call still waits"
    );

    // The daemon restarts under the open page, and bob rejects call 5 as soon as it is
    // back (before or after the page reconnects: the page must end up the same).
    drop(agent);
    drop(cli);
    d.stop().await;
    b.until(
        "the page to notice the daemon is gone",
        "return document.getElementById('status').textContent.includes('reconnecting')",
        json!([]),
    )
    .await;
    let d = start(configured(dir.path(), port)).await;
    let cli = operator_as(&d.socket).await;
    decide(&cli, &sid, 5, "reject").await;
    assert_eq!(
        listed(&d.socket).await,
        vec![4],
        "hitl_list after the restart"
    );
    // Call 4 is offered (its arguments unknown until resent); call 5 is not: gone, or, if
    // alice was still on it, shown decided with no decision button.
    let shown = b
        .until(
            "call 4 alone offered after the restart",
            &format!(
                "const four = document.querySelector(arguments[0]); \
                 const cards = (function () {{ {CARDS} }})(); \
                 return four && four.querySelector('.unknown') \
                 && document.getElementById('status').textContent === 'live' \
                 && cards.every((c) => c.call === '4' || c.buttons === 0) && cards"
            ),
            json!([card_of(&sid, 4)]),
        )
        .await;
    for c in shown.as_array().unwrap() {
        if c["call"] == "4" {
            assert_eq!(c["buttons"], 5, "after the restart: {shown}");
        } else {
            assert_eq!(c["call"], "5", "after the restart: {shown}");
            let text = c["text"].as_str().unwrap();
            assert!(
                text.contains("Rejected by cli-bob") || text.contains("No longer waiting"),
                "after the restart: {shown}"
            );
        }
    }
    // And a reload after the restart: call 4 alone.
    b.sign_in(addr, ALICE).await;
    b.until(
        "call 4 after the restart and a reload",
        "return document.querySelector(arguments[0])",
        json!([card_of(&sid, 4)]),
    )
    .await;
    let shown = b.js(CARDS, json!([])).await;
    let cards = shown.as_array().unwrap();
    assert_eq!(cards.len(), 1, "after the restart and a reload: {shown}");
    assert_eq!(cards[0]["call"], "4", "{shown}");
    assert_eq!(cards[0]["buttons"], 5, "{shown}");
    b.close().await;
    d.stop().await;
}

/// An operator connection over the socket, as `tollgate hitl decide` makes it.
async fn operator_as(socket: &Path) -> tollgate_client::DaemonClient {
    crate::operator(socket).await
}

/// `tollgate hitl decide SESSION WORD --call N --operator cli-bob --note ...`, as the CLI
/// sends it.
async fn decide(cli: &tollgate_client::DaemonClient, sid: &str, n: u64, word: &str) {
    cli.hitl_decide(sp1::HitlDecideRequest {
        session_id: sid.to_owned(),
        call_number: n,
        decision: word.into(),
        operator_id: "cli-bob".into(),
        note: format!("bob's {word}"),
        successor_params_json: if word == "modify" {
            r#"{"i":30}"#.into()
        } else {
            String::new()
        },
        ..Default::default()
    })
    .await
    .unwrap();
}

/// Put the caret of card `card`'s arguments box at `offset`, focused, as a click there
/// would.
const CARET_AT: &str = "const a = document.querySelector(arguments[0] + ' textarea.args'); \
     a.focus(); a.setSelectionRange(arguments[1], arguments[1]); return a.value";

/// What the focused element is and holds: the card it is in, its value and caret.
const FOCUSED: &str = "const a = document.activeElement; const c = a && a.closest('.card'); \
     return { session: c && c.dataset.session, call: c && c.dataset.call, \
              cls: a && a.className, value: a && a.value, caret: a && a.selectionStart }";

/// Issue 16 §4: a push (a new held call arriving) never disturbs an edit in progress: the
/// operator types at offset 2 of an arguments box, a new call is held and pushed, the
/// operator types again, and both keys are where the caret was, one after the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_keeps_the_caret_and_the_typed_text_of_an_edit() {
    let Some((chromium, chromedriver)) = browser_binaries() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = start(configured(dir.path(), 0)).await;
    let addr = d.control.unwrap();
    let first = crate::connect(&d.socket, "reviewed").await;
    let sid = first.session_id().to_owned();
    hold(&d, &first, 1, 501, r#"{"amount":90,"to":"acme-supplies"}"#).await;

    let b = Browser::start(&chromium, &chromedriver, dir.path()).await;
    b.sign_in(addr, ALICE).await;
    let card = card_of(&sid, 1);
    b.until(
        "the held call's arguments",
        "const c = document.querySelector(arguments[0]); return c && c.querySelector('textarea.args').value",
        json!([card]),
    )
    .await;
    let original = b.js(CARET_AT, json!([card, 2])).await;
    let original = original.as_str().unwrap().to_owned();
    assert!(original.starts_with("{\n  \"amount\""), "{original}");
    b.keys("x").await;

    // A new call is held in another session, and one more in this one: both are pushed.
    let second = crate::connect(&d.socket, "reviewed").await;
    hold(&d, &second, 1, 502, r#"{"amount":5}"#).await;
    hold(&d, &first, 2, 503, r#"{"amount":7}"#).await;
    b.until(
        "both new calls on the page",
        "return document.querySelector(arguments[0]) && document.querySelector(arguments[1])",
        json!([card_of(second.session_id(), 1), card_of(&sid, 2)]),
    )
    .await;
    b.keys("y").await;

    // And a push that updates the very card being edited: bob defers it from the command
    // line (it still waits; the card says so), and the agent sends its params again.
    let cli = operator_as(&d.socket).await;
    decide(&cli, &sid, 1, "defer").await;
    let resent = agent_request(
        &d.socket,
        SECRET,
        Payload::HeldParams(sp1::HeldParams {
            session_id: sid.clone(),
            call_number: 1,
            params_json: r#"{"amount":90,"to":"acme-supplies"}"#.into(),
        }),
    )
    .await;
    assert!(matches!(resent, Payload::HeldParamsAck(_)), "{resent:?}");
    b.until(
        "the card being edited to say bob deferred it",
        "return document.querySelector(arguments[0]).innerText.includes('deferred by cli-bob')",
        json!([card]),
    )
    .await;
    b.keys("z").await;

    let focused = b.js(FOCUSED, json!([])).await;
    let want = format!("{}xyz{}", &original[..2], &original[2..]);
    assert_eq!(focused["value"], json!(want), "{focused}");
    assert_eq!(focused["caret"], json!(5), "{focused}");
    assert_eq!(focused["session"], json!(sid), "{focused}");
    assert_eq!(focused["call"], json!("1"), "{focused}");
    let value = b
        .js(
            "return document.querySelector(arguments[0] + ' textarea.args').value",
            json!([card]),
        )
        .await;
    assert_eq!(value, json!(want));
    b.close().await;
    drop((first, second));
    d.stop().await;
}

/// Issue 16 §4: an inline error on a card (edited arguments that are not JSON) stays, with
/// the edit and the note, when a push arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_keeps_an_inline_error() {
    let Some((chromium, chromedriver)) = browser_binaries() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = start(configured(dir.path(), 0)).await;
    let addr = d.control.unwrap();
    let first = crate::connect(&d.socket, "reviewed").await;
    let sid = first.session_id().to_owned();
    hold(&d, &first, 1, 601, r#"{"amount":90}"#).await;

    let b = Browser::start(&chromium, &chromedriver, dir.path()).await;
    b.sign_in(addr, ALICE).await;
    let card = card_of(&sid, 1);
    b.until(
        "the held call's arguments",
        "const c = document.querySelector(arguments[0]); return c && c.querySelector('textarea.args').value",
        json!([card]),
    )
    .await;
    // Break the JSON, write a note, try to approve the edit: an inline error.
    b.js(CARET_AT, json!([card, 0])).await;
    b.keys("!").await;
    b.type_into(&format!("{card} input.note"), "one dollar, not ninety")
        .await;
    b.click(&format!("{card} button[data-decision=modify]"))
        .await;
    let error = b
        .until(
            "the inline error",
            "const m = document.querySelector(arguments[0] + ' .msg.err'); return m && m.textContent",
            json!([card]),
        )
        .await;
    assert!(error.as_str().unwrap().contains("not JSON"), "{error}");

    // A new call is held and pushed.
    let second = crate::connect(&d.socket, "reviewed").await;
    hold(&d, &second, 1, 602, r#"{"amount":5}"#).await;
    b.until(
        "the new call on the page",
        "return document.querySelector(arguments[0])",
        json!([card_of(second.session_id(), 1)]),
    )
    .await;
    let after = b
        .js(
            "const c = document.querySelector(arguments[0]); const m = c.querySelector('.msg.err'); \
             return { inline: m && m.textContent, args: c.querySelector('textarea.args').value, \
                      note: c.querySelector('input.note').value }",
            json!([card]),
        )
        .await;
    assert_eq!(after["inline"], error, "{after}");
    assert!(after["args"].as_str().unwrap().starts_with("!{"), "{after}");
    assert_eq!(after["note"], "one dollar, not ninety", "{after}");
    b.close().await;
    drop((first, second));
    d.stop().await;
}

/// Where the console tests put their screenshots of the main states, for people to look at.
fn shots() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/console-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Pre-exec call `call_number` of `agent`'s session: tool `tool`, params `params`, tags
/// `tags`; its verdict.
async fn call(
    agent: &tollgate_client::DaemonClient,
    call_number: u64,
    nonce: u64,
    tool: &str,
    params: &str,
    tags: &[(&str, &str)],
) -> tollgate_client::ClientVerdict {
    let p = tjson::parse_str(params).unwrap();
    agent
        .pre_exec_request(sp1::PreExecRequest {
            session_id: agent.session_id().to_owned(),
            call_number,
            tool_name: tool.into(),
            tool_params_hash: digest(&p),
            estimated_cost_usd: 0.25,
            nonce,
            tags: tags
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..Default::default()
        })
        .await
}

/// Hold call `call_number` (tool `tool`) of `agent`'s session (agent `reviewed`: HITL
/// always) and show operators its params; `secret`: its organization's agents' secret.
async fn hold_tool(
    d: &Running,
    agent: &tollgate_client::DaemonClient,
    secret: &[u8],
    call_number: u64,
    tool: &str,
    params: &str,
    tags: &[(&str, &str)],
) {
    let v = call(agent, call_number, 70_000 + call_number, tool, params, tags).await;
    assert_eq!(v.verdict, tollgate_core::Verdict::Hitl, "{v:?}");
    let ack = agent_request(
        &d.socket,
        secret,
        Payload::HeldParams(sp1::HeldParams {
            session_id: agent.session_id().to_owned(),
            call_number,
            params_json: params.to_owned(),
        }),
    )
    .await;
    assert!(matches!(ack, Payload::HeldParamsAck(_)), "{ack:?}");
}

/// Set a filter control (`select` or checkbox or search box) as the operator would, and
/// let the page apply it.
const SET_CONTROL: &str = "const e = document.getElementById(arguments[0]); \
     if (e.type === 'checkbox') e.checked = arguments[1] === 'on'; else e.value = arguments[1]; \
     e.dispatchEvent(new Event(e.type === 'search' ? 'input' : 'change')); return true";

/// How many held-call cards are shown (not hidden by a filter or folded into a group).
const SHOWN: &str = "return Array.from(document.querySelectorAll('#held .card')) \
     .filter((c) => c.offsetParent !== null).length";

/// Issue 20 §2, one held call in depth: why it was held, in words, with the rule and the
/// guard setting; what the session did before (its last calls with tool, verdict and cost,
/// from the daemon's log) and the agent's stated purpose; a field-by-field form for its
/// flat arguments whose edit is shown as a diff before it is sent; agent text that tries
/// to be HTML stays text; the history (operator, decision, tool, note, the change) is
/// searchable and survives a restart, after which a held call's card says what the
/// operator can do while its arguments are unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_call_is_explained_with_its_context_and_edited_field_by_field() {
    let Some((chromium, chromedriver)) = browser_binaries() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let d = start(configured(dir.path(), port)).await;
    let addr = d.control.unwrap();

    // The session's history: call 1 held, approved by bob from the command line, run as
    // call 2 and settled (charged its $0.25 estimate, the guard's settlement).
    let agent = crate::connect(&d.socket, "reviewed").await;
    let sid = agent.session_id().to_owned();
    hold_tool(&d, &agent, SECRET, 1, "deploy", r#"{"i":1}"#, &[]).await;
    let cli = operator_as(&d.socket).await;
    decide(&cli, &sid, 1, "approve").await;
    let v = call(&agent, 2, 70_001, "deploy", r#"{"i":1}"#, &[]).await;
    assert_eq!(v.reason, "hitl_transition:approve", "{v:?}");
    agent.post_exec(2, 0.2, true, "").await.unwrap();
    // Call 3: a tool name, arguments and a purpose that try to be HTML.
    let tool = "<img src=x onerror=\"window.__xss=1\">deploy";
    let args = r#"{"dry_run":false,"note":"<script>window.__xss=2</script>","replicas":30,"service":"api"}"#;
    let purpose = "Roll out <b onmouseover=\"window.__xss=3\">api</b> v2 for the launch";
    hold_tool(&d, &agent, SECRET, 3, tool, args, &[("purpose", purpose)]).await;

    let b = Browser::start(&chromium, &chromedriver, dir.path()).await;
    b.sign_in(addr, ALICE).await;
    let card = card_of(&sid, 3);
    b.until(
        "the held call's form",
        "const c = document.querySelector(arguments[0]); return c && c.querySelectorAll('.form .field').length === 4",
        json!([card]),
    )
    .await;
    // Why held, in words, with the rule and the setting; the code stays beside it.
    let why = b
        .js(
            "return document.querySelector(arguments[0] + ' .why').textContent",
            json!([card]),
        )
        .await;
    let why = why.as_str().unwrap();
    assert!(
        why.contains("Every call of this agent waits for a human: rule 8, hitl_mode = \"always\" in `[guard.agents.reviewed]`.")
            && why.contains("(hitl_all_calls)"),
        "{why}"
    );
    // The session's last calls, newest first, from the daemon's log.
    let context = b
        .until(
            "the session's last calls",
            "const t = document.querySelector(arguments[0] + ' .context table'); return t && t.innerText",
            json!([card]),
        )
        .await;
    let rows: Vec<&str> = context.as_str().unwrap().lines().collect();
    assert!(rows.len() >= 4, "{context}");
    for (row, want) in rows[1..].iter().zip([
        ["#3", tool, "HITL", "hitl_all_calls", "$0.2500 est."],
        [
            "#2",
            "deploy",
            "ALLOW",
            "hitl_transition:approve (cli-bob)",
            "$0.2500 charged",
        ],
        ["#1", "deploy", "HITL", "hitl_all_calls", "$0.2500 est."],
    ]) {
        for w in want {
            assert!(row.contains(w), "`{w}` not in `{row}`:\n{context}");
        }
    }
    // The purpose, the tool and the arguments as text: no element came from them.
    let safe = b
        .js(
            "const c = document.querySelector(arguments[0]); \
             return { xss: window.__xss || null, imgs: document.querySelectorAll('img, b').length, \
                      scripts: document.querySelectorAll('script').length, \
                      tool: c.querySelector('.tool').textContent, \
                      purpose: c.querySelector('.context .purpose').textContent, \
                      note: c.querySelector('.field[data-key=note]').value }",
            json!([card]),
        )
        .await;
    assert_eq!(
        safe,
        json!({"xss": null, "imgs": 0, "scripts": 1, "tool": tool,
               "purpose": format!("Agent's stated purpose: {purpose}"),
               "note": "<script>window.__xss=2</script>"}),
    );
    // Edit a field: the raw JSON follows, and the diff says what changes before it is sent.
    b.clear(&format!("{card} .field[data-key=replicas]")).await;
    b.type_into(&format!("{card} .field[data-key=replicas]"), "3")
        .await;
    let edit = b
        .js(
            "const c = document.querySelector(arguments[0]); \
             return { raw: c.querySelector('textarea.args').value, diff: c.querySelector('.diff').innerText, \
                      modify: !c.querySelector('button[data-decision=modify]').disabled || 'disabled until noted' }",
            json!([card]),
        )
        .await;
    assert_eq!(
        edit["raw"],
        json!("{\n  \"dry_run\": false,\n  \"note\": \"<script>window.__xss=2</script>\",\n  \"replicas\": 3,\n  \"service\": \"api\"\n}")
    );
    let diff = edit["diff"].as_str().unwrap();
    assert!(
        diff.contains("− replicas: 30\n+ replicas: 3") && !diff.contains("service"),
        "{diff}"
    );
    // A number that is not one is refused by the form, and the raw JSON keeps the last
    // good value.
    b.type_into(&format!("{card} .field[data-key=replicas]"), "x")
        .await;
    let bad = b
        .js(
            "const c = document.querySelector(arguments[0]); \
             return [c.querySelector('.field[data-key=replicas]').className, c.querySelector('textarea.args').value.includes('\"replicas\": 3,')]",
            json!([card]),
        )
        .await;
    assert_eq!(bad, json!(["field bad", true]));
    b.type_into(&format!("{card} .field[data-key=replicas]"), "\u{E003}")
        .await;
    b.type_into(
        &format!("{card} input.note"),
        "30 replicas is a typo; 3 is the plan",
    )
    .await;
    b.screenshot(&shots().join("1-held-call-explained-context-form-diff.png"))
        .await;
    b.click(&format!("{card} button[data-decision=modify]"))
        .await;
    b.until(
        "the decided call to leave",
        "return !document.querySelector(arguments[0])",
        json!([card]),
    )
    .await;
    let waited = agent_request(
        &d.socket,
        SECRET,
        Payload::AwaitDecision(sp1::AwaitDecisionRequest {
            session_id: sid.clone(),
            call_number: 3,
            timeout_ms: 5000,
        }),
    )
    .await;
    let Payload::AwaitDecisionResponse(r) = waited else {
        panic!("{waited:?}")
    };
    assert_eq!(
        (r.outcome.as_str(), r.successor_params_json.as_str()),
        (
            "modify",
            r#"{"dry_run":false,"note":"<script>window.__xss=2</script>","replicas":3,"service":"api"}"#
        )
    );

    // The history: who, what, which tool, the note and the change; searchable.
    let history = b
        .until(
            "the modify in the history",
            "const t = document.getElementById('history').innerText; return t.includes('modify by alice') && t",
            json!([]),
        )
        .await;
    let history = history.as_str().unwrap();
    for want in [
        "modify by alice",
        tool,
        "30 replicas is a typo; 3 is the plan",
        "replicas: 30 → 3",
        "approve by cli-bob",
        "bob's approve",
    ] {
        assert!(
            history.contains(want),
            "`{want}` not in the history:\n{history}"
        );
    }
    b.type_into("#history-search", "TYPO alice").await;
    let found = b
        .until(
            "the search to keep the modify alone",
            "const l = document.querySelectorAll('#history li'); return l.length === 1 && l[0].innerText",
            json!([]),
        )
        .await;
    assert!(
        found.as_str().unwrap().contains("modify by alice"),
        "{found}"
    );
    b.clear("#history-search").await;
    b.type_into("#history-search", "x\u{E003}").await;

    // A call held across a restart: the daemon forgets arguments (memory only), the card
    // says what the operator can do; the history comes back from the audit log.
    hold_tool(&d, &agent, SECRET, 4, "deploy", r#"{"i":4}"#, &[]).await;
    b.until(
        "call 4",
        "return document.querySelector(arguments[0])",
        json!([card_of(&sid, 4)]),
    )
    .await;
    drop((agent, cli));
    d.stop().await;
    b.until(
        "the page to notice the daemon is gone",
        "return document.getElementById('status').textContent.includes('reconnecting')",
        json!([]),
    )
    .await;
    let d = start(configured(dir.path(), port)).await;
    let unknown = b
        .until(
            "call 4 with its arguments unknown",
            "const c = document.querySelector(arguments[0]); const u = c && c.querySelector('.unknown'); \
             return document.getElementById('status').textContent === 'live' && u && u.innerText",
            json!([card_of(&sid, 4)]),
        )
        .await;
    let unknown = unknown.as_str().unwrap();
    assert!(
        unknown.contains("Arguments unknown")
            && unknown.contains("What you can do: wait")
            && unknown.contains("or reject the call, which needs no arguments"),
        "{unknown}"
    );
    b.sign_in(addr, ALICE).await;
    let history = b
        .until(
            "the history after a restart and a reload",
            "const t = document.getElementById('history').innerText; \
             return t.includes('modify by alice') && t.includes('approve by cli-bob') && t",
            json!([]),
        )
        .await;
    let history = history.as_str().unwrap();
    assert!(
        history.contains("30 replicas is a typo; 3 is the plan")
            && history.contains("(SHA-256; the arguments themselves are kept in memory only"),
        "{history}"
    );
    b.until(
        "call 4 after the reload",
        "return document.querySelector(arguments[0] + ' .unknown')",
        json!([card_of(&sid, 4)]),
    )
    .await;
    b.screenshot(&shots().join("4-after-a-restart-arguments-unknown-history-kept.png"))
        .await;
    b.close().await;
    d.stop().await;
}

/// Issue 20 §2, "fifty held calls": filter and search by organization, agent, tool and
/// age; identical calls grouped; the count in the tab's title and a notification for each
/// new one (with the operator's permission); the status in view at the bottom of the
/// page; shortcuts that never fire while typing; and the fifty cleared from the keyboard,
/// one by one and in bulk, each decision its own audit entry with its note.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_held_calls_are_filtered_grouped_and_cleared_from_the_keyboard() {
    let Some((chromium, chromedriver)) = browser_binaries() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = start(configured(dir.path(), 0)).await;
    let addr = d.control.unwrap();
    let b = Browser::start(&chromium, &chromedriver, dir.path()).await;
    // bob operates acme and globex.
    b.sign_in(addr, crate::control::BOB).await;
    // Notifications, as the browser would give them once the operator allows them.
    b.js(
        "window.__notes = []; window.Notification = class { \
           constructor(title, o) { window.__notes.push([title, o.body]); } \
           static requestPermission() { window.Notification.permission = 'granted'; return Promise.resolve('granted'); } }; \
         window.Notification.permission = 'default'; return true",
        json!([]),
    )
    .await;
    b.click("#notify").await;
    b.until(
        "notifications on",
        "return document.getElementById('notify').textContent === 'Notifications on'",
        json!([]),
    )
    .await;

    // Fifty held calls: four acme sessions and one globex session of ten calls each. Call 1
    // of every session is the same refund (identical calls: four in acme, one in globex);
    // the others differ.
    let mut sessions = Vec::new();
    for s in 0..5u64 {
        let (org_secret, client) = if s == 4 {
            let mut c = tollgate_client::ClientConfig::new(
                &d.socket,
                crate::control::OTHER_ORG,
                crate::control::OTHER_SECRET,
                "reviewed",
            );
            c.timeout = Duration::from_secs(5);
            (
                crate::control::OTHER_SECRET,
                tollgate_client::DaemonClient::connect(c).await.unwrap(),
            )
        } else {
            (SECRET, crate::connect(&d.socket, "reviewed").await)
        };
        for n in 1..=10u64 {
            let (tool, params) = match n {
                1 => (
                    "refund",
                    r#"{"amount":100,"to":"acme-supplies"}"#.to_owned(),
                ),
                2..=4 => ("email", format!(r#"{{"to":"ops+{s}-{n}@example.com"}}"#)),
                _ => ("deploy", format!(r#"{{"replicas":{n},"session":{s}}}"#)),
            };
            hold_tool(&d, &client, org_secret, n, tool, &params, &[]).await;
        }
        sessions.push(client);
    }
    b.until(
        "fifty cards",
        "return document.querySelectorAll('#held .card').length === 50",
        json!([]),
    )
    .await;
    // Noticed: the count in the title and in the header, and one notification per call.
    let noticed = b
        .until(
            "the title and the notifications",
            "return document.title === '(50) Tollgate console' && window.__notes.length === 50 \
             && { title: document.title, badge: document.getElementById('held-badge').textContent, first: window.__notes[0] }",
            json!([]),
        )
        .await;
    assert_eq!(noticed["badge"], "50 held", "{noticed}");
    assert_eq!(noticed["first"][0], "Held: refund", "{noticed}");
    // Grouped: acme's four identical refunds are one card with a head; 47 cards shown.
    assert_eq!(b.js(SHOWN, json!([])).await, json!(47));
    let head = b
        .js(
            "const h = Array.from(document.querySelectorAll('.grouphead')).filter((h) => h.offsetParent !== null); \
             return h.map((x) => x.innerText)",
            json!([]),
        )
        .await;
    assert_eq!(head.as_array().unwrap().len(), 1, "{head}");
    assert!(
        head[0]
            .as_str()
            .unwrap()
            .starts_with("4 identical calls (same tool and arguments, 1 agent(s), 4 sessions)"),
        "{head}"
    );
    let height = b
        .js(
            "return document.getElementById('held').scrollHeight",
            json!([]),
        )
        .await;
    b.screenshot(&shots().join("2-fifty-held-calls-grouped.png"))
        .await;
    // The page scrolled to its end: the status, the count and the filters stay in view.
    let in_view = b
        .js(
            "window.scrollTo(0, document.body.scrollHeight); \
             const r = (id) => document.getElementById(id).getBoundingClientRect(); \
             return [window.scrollY > 1000, r('status').top >= 0 && r('status').bottom <= 60, \
                     r('held-badge').top >= 0 && r('held-badge').bottom <= 60, r('search').top >= 0 && r('search').bottom < 200]",
            json!([]),
        )
        .await;
    assert_eq!(in_view, json!([true, true, true, true]));
    b.js("window.scrollTo(0, 0); return true", json!([])).await;
    eprintln!("fifty held calls: the column is {height} px tall (grouped, one card open)");
    assert!(
        height.as_i64().unwrap() < 8_000,
        "fifty held calls make a column {height} px tall"
    );

    // Filters: organization, agent, tool, age, and search; each says what it hides.
    for (control, value, shown) in [
        ("f-org", "globex", 10),
        ("f-org", "", 47),
        ("f-tool", "email", 15),
        ("f-tool", "refund", 2),
        ("group", "off", 5),
        ("f-tool", "", 50),
        ("group", "on", 47),
        ("f-agent", "reviewed", 47),
        ("f-age", "3600", 0),
        ("f-age", "-60", 47),
        ("f-age", "", 47),
        ("search", "ops+2-3", 1),
        ("search", "replicas\":7", 5),
    ] {
        b.js(SET_CONTROL, json!([control, value])).await;
        let n = b.js(SHOWN, json!([])).await;
        assert_eq!(n, json!(shown), "{control} = {value:?}");
    }
    let hidden = b
        .js(
            "return document.getElementById('filtered').textContent",
            json!([]),
        )
        .await;
    assert_eq!(hidden, json!("45 of 50 hidden by the filters"));
    b.screenshot(&shots().join("3-filtered-by-search.png"))
        .await;
    b.js(SET_CONTROL, json!(["search", ""])).await;
    b.js(SET_CONTROL, json!(["f-age", ""])).await;

    // Shortcuts are on the page, and never fire while typing: "/" goes to the search box;
    // what is typed there (j, a, r, x, *) stays text.
    let keys = b
        .js(
            "return document.getElementById('keys').innerText",
            json!([]),
        )
        .await;
    for k in ["j/k", "a approve", "r reject", "n write its note"] {
        assert!(keys.as_str().unwrap().contains(k), "{keys}");
    }
    b.keys("?").await;
    b.until(
        "the shortcut list",
        "return !document.getElementById('help').classList.contains('hidden')",
        json!([]),
    )
    .await;
    b.keys("\u{E00C}/jarx*A").await;
    let typed = b
        .js(
            "return [document.activeElement.id, document.getElementById('search').value, \
                     document.querySelectorAll('.card.picked').length, document.querySelectorAll('#held .card').length, \
                     document.getElementById('help').classList.contains('hidden')]",
            json!([]),
        )
        .await;
    assert_eq!(typed, json!(["search", "jarx*A", 0, 50, true]));
    // Esc leaves the box; clearing it shows all again.
    b.keys("\u{E003}\u{E003}\u{E003}\u{E003}\u{E003}\u{E003}\u{E00C}")
        .await;
    assert_eq!(b.js(SHOWN, json!([])).await, json!(47));

    // Twenty calls one by one: n, the note, Esc, a (every fifth: r). The note's own "a" and
    // "r" are typed, not decided.
    let mut expected: Vec<(String, u64, &str, String)> = Vec::new();
    for i in 0..20 {
        let now = b
            .until(
                "a current card",
                "const c = document.querySelector('#held .card.current:not(.decided)'); \
                 return c && !c._sending && [c.dataset.session, c.dataset.call]",
                json!([]),
            )
            .await;
        let (sid, n) = (
            now[0].as_str().unwrap().to_owned(),
            now[1].as_str().unwrap().parse::<u64>().unwrap(),
        );
        let (key, word) = if i % 5 == 4 {
            ("r", "reject")
        } else {
            ("a", "approve")
        };
        let note = format!("read it: a call {i} for ops");
        b.keys("n").await;
        b.keys(&note).await;
        b.keys("\u{E00C}").await;
        b.keys(key).await;
        b.until(
            "the decided card to leave",
            "return !document.querySelector(arguments[0])",
            json!([card_of(&sid, n)]),
        )
        .await;
        expected.push((sid, n, word, note));
    }
    assert_eq!(
        b.js(
            "return document.querySelectorAll('#held .card').length",
            json!([])
        )
        .await,
        json!(30)
    );
    // Thirty in bulk: * selects every call shown (the folded identical ones too), b the
    // note, A approves each, one decision each.
    let left = b
        .js(
            "return Array.from(document.querySelectorAll('#held .card')).map((c) => [c.dataset.session, c.dataset.call])",
            json!([]),
        )
        .await;
    b.keys("*b").await;
    b.keys("bulk: reviewed with finance").await;
    b.keys("\u{E00C}").await;
    let selected = b
        .js(
            "return [document.getElementById('bulk-count').textContent, document.getElementById('bulk-approve').textContent]",
            json!([]),
        )
        .await;
    assert_eq!(selected, json!(["30 selected", "Approve 30 selected"]));
    b.screenshot(&shots().join("5-thirty-selected-for-bulk-approve.png"))
        .await;
    b.keys("A").await;
    let done = b
        .until(
            "every call decided",
            "return document.querySelectorAll('#held .card').length === 0 && document.getElementById('bulk-msg').textContent",
            json!([]),
        )
        .await;
    assert!(
        done.as_str().unwrap().starts_with("Approved 30 of 30"),
        "{done}"
    );
    assert_eq!(
        b.js("return document.title", json!([])).await,
        json!("Tollgate console")
    );
    b.screenshot(&shots().join("6-backlog-cleared.png")).await;
    for c in left.as_array().unwrap() {
        expected.push((
            c[0].as_str().unwrap().to_owned(),
            c[1].as_str().unwrap().parse().unwrap(),
            "approve",
            "bulk: reviewed with finance".to_owned(),
        ));
    }
    b.close().await;

    // Every decision is its own audit entry, by bob, with its note, one per held call.
    let mut human: Vec<(String, u64, String, String)> = session_events(&d.dir)
        .into_iter()
        .filter_map(|e| match e {
            tollgate_audit::SessionEvent::HumanDecision(h) => {
                assert_eq!(h.operator_id, "bob", "{h:?}");
                Some((
                    h.session_id,
                    h.call_number,
                    h.decision.as_str().to_owned(),
                    h.note,
                ))
            }
            _ => None,
        })
        .collect();
    human.sort();
    let mut expected: Vec<(String, u64, String, String)> = expected
        .into_iter()
        .map(|(s, n, w, note)| (s, n, w.to_owned(), note))
        .collect();
    expected.sort();
    assert_eq!(human.len(), 50);
    assert_eq!(human, expected);
    assert_eq!(listed(&d.socket).await, Vec::<u64>::new());
    drop(sessions);
    d.stop().await;
}

/// Issue 18: a call a `@hitl` policy holds is explained in the console by that policy, its
/// id and its `@hitl` text, never by a guard setting; the session's calls show the reason
/// the agent was sent (`policy:<id>`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_a_policy_holds_is_explained_by_the_policy_in_the_browser() {
    let Some((chromium, chromedriver)) = browser_binaries() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut c = configured(dir.path(), port);
    let rules = dir.path().join("rules.cedar");
    std::fs::write(
        &rules,
        "@id(\"prod-deploys\") @hitl(\"production deploys need a second pair of eyes\")\n\
         permit (principal, action == Action::\"deploy\", resource);\n",
    )
    .unwrap();
    c.policy = Some(tollgate_daemon::config::PolicySettings {
        files: vec![rules],
        default: tollgate_policy::DefaultEffect::Allow,
        schema: None,
        trip_on_refusal: false,
        shadow: false,
    });
    let d = start(c).await;
    let addr = d.control.unwrap();
    // An agent on the default guard, which holds nothing itself.
    let agent = crate::connect(&d.socket, "helper").await;
    let sid = agent.session_id().to_owned();
    let v = call(&agent, 1, 71_001, "search", r#"{"q":"x"}"#, &[]).await;
    assert_eq!(v.verdict, tollgate_core::Verdict::Allow, "{v:?}");
    hold_tool(&d, &agent, SECRET, 2, "deploy", r#"{"service":"api"}"#, &[]).await;

    let b = Browser::start(&chromium, &chromedriver, dir.path()).await;
    b.sign_in(addr, ALICE).await;
    let card = card_of(&sid, 2);
    b.until(
        "the held call's card",
        "return !!document.querySelector(arguments[0] + ' .why')",
        json!([card]),
    )
    .await;
    let why = b
        .js(
            "return document.querySelector(arguments[0] + ' .why').textContent",
            json!([card]),
        )
        .await;
    let why = why.as_str().unwrap();
    assert!(
        why.contains(
            "The `@hitl` policy `prod-deploys` of the daemon's [policy] set holds it for a human: \"production deploys need a second pair of eyes\"."
        ) && why.contains("(policy_hold)")
            && !why.contains("[guard"),
        "{why}"
    );
    let context = b
        .until(
            "the session's last calls",
            "const t = document.querySelector(arguments[0] + ' .context table'); return t && t.innerText",
            json!([card]),
        )
        .await;
    let rows: Vec<&str> = context.as_str().unwrap().lines().collect();
    assert!(rows.len() >= 3, "{context}");
    for (row, want) in rows[1..].iter().zip([
        ["#2", "deploy", "HITL", "policy:prod-deploys"],
        ["#1", "search", "ALLOW", ""],
    ]) {
        for w in want {
            assert!(row.contains(w), "`{w}` not in `{row}`:\n{context}");
        }
    }
    b.close().await;
    d.stop().await;
}
