//! Who may do what, with real requests to a real `ferry serve` (SECURITY.md): HTTP's token
//! and its Origin / Host / Content-Type checks, QUIC's token, tokens for plain JSON
//! connections, and tasks that only their owner can see. Linux only: the tests speak raw
//! bytes to abstract socket names and kill servers with signals.
#![cfg(all(feature = "rpc", target_os = "linux"))]
#![cfg_attr(not(all(feature = "http", feature = "quic")), allow(dead_code))]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{exe, run};

/// A `ferry serve` child with its stdout lines and its stderr in a file; killed on drop.
struct Proc {
    child: Child,
    addr: String,
    url: Option<String>,
    dir: tempfile::TempDir,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr")).unwrap_or_default()
    }

    /// `HOST:PORT` of the HTTP listener.
    fn http(&self) -> String {
        let url = self.url.as_deref().expect("started with --http");
        url.trim_start_matches("http://").trim_end_matches('/').to_owned()
    }
}

fn unique_unix() -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    format!("unix:ferry-access-{}-{}", std::process::id(), N.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
}

/// Starts `ferry serve ARGS` (its config directory private to the test) and waits for its
/// `listening on` line (and `http on` with `--http`).
fn serve(args: &[&str], env: &[(&str, &str)]) -> Proc {
    let dir = tempfile::Builder::new().prefix("ferry-access-").tempdir().unwrap();
    let err = std::fs::File::create(dir.path().join("stderr")).unwrap();
    let mut cmd = Command::new(exe());
    cmd.arg("serve").args(args).env("XDG_CONFIG_HOME", dir.path()).env_remove("FERRY_TOKEN");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(err).spawn().unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            if tx.send(line.unwrap_or_default()).is_err() {
                return;
            }
        }
    });
    let line = rx.recv_timeout(Duration::from_secs(30)).expect("ferry serve said nothing");
    let addr = line.strip_prefix("listening on ").unwrap_or_else(|| panic!("ferry serve said {line:?}")).to_owned();
    let url = args.contains(&"--http").then(|| {
        let line = rx.recv_timeout(Duration::from_secs(30)).expect("no http line");
        line.strip_prefix("http on ").expect("http on URL").to_owned()
    });
    Proc { child, addr, url, dir }
}

/// One HTTP/1.1 request with `headers` on a fresh connection: (status, headers, body).
fn http(hostport: &str, method: &str, headers: &[(&str, &str)], body: &str) -> (u16, String, String) {
    let mut s = std::net::TcpStream::connect(hostport).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut req = format!("{method} / HTTP/1.1\r\nContent-Length: {}\r\nConnection: close\r\n", body.len());
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (head[9..12].parse().unwrap(), head.to_ascii_lowercase(), body.to_owned())
}

const ADD: &str = r#"{"jsonrpc":"2.0","method":"add","params":[1,2],"id":1}"#;
const JSON: (&str, &str) = ("Content-Type", "application/json");
const LOCAL: (&str, &str) = ("Host", "localhost");

fn error_code(body: &str) -> i64 {
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body:?}"));
    v["error"]["code"].as_i64().unwrap_or_else(|| panic!("no error: {body}"))
}

#[cfg(feature = "http")]
#[test]
fn http_refuses_browser_origins_foreign_hosts_and_other_content_types_before_the_body() {
    let p = serve(&[&unique_unix(), "--http", "127.0.0.1:0", "--http-allow-origin", "https://app.example"], &[]);
    let h = p.http();
    assert!(p.stderr().contains("any local user can call it"), "no warning: {}", p.stderr());
    // What a web page could send today: text/plain, a foreign origin, a rebinding host.
    let (status, _, body) = http(
        &h,
        "POST",
        &[("Content-Type", "text/plain"), ("Origin", "http://evil.example"), ("Host", "evil.example")],
        ADD,
    );
    assert_eq!(status, 403, "{body}");
    assert_eq!(error_code(&body), -32008);
    assert!(!body.contains("result"), "{body}");
    // Each check on its own.
    let (status, _, body) = http(&h, "POST", &[JSON, LOCAL, ("Origin", "http://evil.example")], ADD);
    assert_eq!(status, 403);
    assert!(body.contains("--http-allow-origin"), "{body}");
    let (status, _, body) = http(&h, "POST", &[JSON, ("Host", "evil.example:8080")], ADD);
    assert_eq!(status, 403);
    assert!(body.contains("--http-allow-host"), "{body}");
    let (status, _, body) = http(&h, "POST", &[("Content-Type", "text/plain"), LOCAL], ADD);
    assert_eq!(status, 415);
    assert!(body.contains("application/json"), "{body}");
    let (status, _, _) = http(&h, "POST", &[LOCAL], ADD);
    assert_eq!(status, 415, "no Content-Type at all");
    // A well-formed local request is served, on the bound address as on localhost.
    let (status, _, body) = http(&h, "POST", &[JSON, ("Content-Type", "application/json; charset=utf-8"), LOCAL], ADD);
    assert_eq!((status, body.contains("\"result\":3.0")), (200, true), "{body}");
    let (status, _, body) = http(&h, "POST", &[JSON, ("Host", &h)], ADD);
    assert_eq!((status, body.contains("\"result\":3.0")), (200, true), "{body}");
    // An allowed origin gets its CORS answers.
    let (status, head, _) = http(&h, "OPTIONS", &[LOCAL, ("Origin", "https://app.example")], "");
    assert_eq!(status, 204);
    assert!(head.contains("access-control-allow-origin: https://app.example"), "{head}");
    let (status, head, body) = http(&h, "POST", &[JSON, LOCAL, ("Origin", "https://app.example")], ADD);
    assert_eq!((status, body.contains("\"result\":3.0")), (200, true), "{body}");
    assert!(head.contains("access-control-allow-origin: https://app.example"), "{head}");
}

#[cfg(feature = "http")]
#[test]
fn http_and_plain_json_with_a_token() {
    let p = serve(&[&unique_unix(), "--http", "127.0.0.1:0"], &[("FERRY_TOKEN", "s3cret-token")]);
    let h = p.http();
    assert!(!p.stderr().contains("any local user"), "{}", p.stderr());
    let (status, head, body) = http(&h, "POST", &[JSON, LOCAL], ADD);
    assert_eq!(status, 401, "{body}");
    assert!(head.contains("www-authenticate: bearer"), "{head}");
    assert_eq!(error_code(&body), -32008);
    let (status, _, _) = http(&h, "POST", &[JSON, LOCAL, ("Authorization", "Bearer s3cret-tokem")], ADD);
    assert_eq!(status, 401, "a wrong token");
    let (status, _, body) = http(&h, "POST", &[JSON, LOCAL, ("Authorization", "Bearer s3cret-token")], ADD);
    assert_eq!((status, body.contains("\"result\":3.0")), (200, true), "{body}");

    // ferry clients present it in the handshake (--token, or FERRY_TOKEN).
    let no = run(
        Command::new(exe()).args(["call", &p.addr, "add", "[1, 2]"]).env_remove("FERRY_TOKEN"),
        Duration::from_secs(60),
    );
    assert!(!no.status.success());
    assert!(String::from_utf8_lossy(&no.stderr).contains("token"), "{}", String::from_utf8_lossy(&no.stderr));
    let yes = run(
        Command::new(exe()).args(["call", &p.addr, "add", "[1, 2]", "--token", "s3cret-token"]),
        Duration::from_secs(60),
    );
    assert!(yes.status.success(), "{}", String::from_utf8_lossy(&yes.stderr));
    assert_eq!(String::from_utf8_lossy(&yes.stdout).trim(), "3.0");
    let env = run(
        Command::new(exe()).args(["call", &p.addr, "add", "[1, 2]"]).env("FERRY_TOKEN", "s3cret-token"),
        Duration::from_secs(60),
    );
    assert!(env.status.success(), "{}", String::from_utf8_lossy(&env.stderr));

    // A plain JSON-RPC connection on the socket cannot present one: it is told so, and closed.
    let mut s = common::connect_abstract(&p.addr);
    s.write_all(format!("{ADD}\n").as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert_eq!(error_code(out.trim()), -32008, "{out}");
    assert!(!out.contains("result"), "{out}");
}

#[cfg(feature = "http")]
#[test]
fn http_off_loopback_needs_a_token_or_an_explicit_opt_out() {
    let out = run(
        Command::new(exe()).args(["serve", &unique_unix(), "--http", "0.0.0.0:0"]).env_remove("FERRY_TOKEN"),
        Duration::from_secs(60),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--allow-unauthenticated") && err.contains("--token"), "{err}");
    let p = serve(&[&unique_unix(), "--http", "0.0.0.0:0", "--allow-unauthenticated"], &[]);
    // Bound to every address: the Host must be a loopback address, localhost or allowed.
    let port = p.http().rsplit_once(':').unwrap().1.to_owned();
    let (status, _, body) = http(&format!("127.0.0.1:{port}"), "POST", &[JSON, LOCAL], ADD);
    assert_eq!((status, body.contains("\"result\":3.0")), (200, true), "{body}");
    let p2 = serve(&[&unique_unix(), "--http", "0.0.0.0:0", "--token", "t"], &[]);
    assert!(p2.url.is_some());
}

#[cfg(feature = "quic")]
mod quic {
    use ferry::ferry_rpc::codes::{TASK_NOT_FOUND, TASK_PENDING};
    use ferry::ferry_rpc::{Client, TaskState};
    use serde_json::json;

    use super::*;

    async fn t<F: std::future::Future>(f: F) -> F::Output {
        tokio::time::timeout(Duration::from_secs(30), f).await.expect("timed out")
    }

    async fn client(addr: &str, token: Option<&str>) -> Client {
        let mut ep = ferry::endpoint();
        if let Some(tk) = token {
            ep = ep.token(tk);
        }
        Client::new(t(ep.build().connect(addr)).await.unwrap())
    }

    #[test]
    fn quic_token_from_the_command_line() {
        let p = serve(&["quic://127.0.0.1:0", "--token", "q-token"], &[]);
        let no = run(
            Command::new(exe()).args(["call", &p.addr, "add", "[1, 2]"]).env_remove("FERRY_TOKEN"),
            Duration::from_secs(60),
        );
        assert!(!no.status.success());
        assert!(String::from_utf8_lossy(&no.stderr).contains("token"), "{}", String::from_utf8_lossy(&no.stderr));
        let yes = run(
            Command::new(exe()).args(["call", &p.addr, "add", "[1, 2]", "--token", "q-token"]),
            Duration::from_secs(60),
        );
        assert!(yes.status.success(), "{}", String::from_utf8_lossy(&yes.stderr));
        assert_eq!(String::from_utf8_lossy(&yes.stdout).trim(), "3.0");
        // Off loopback, no token: refused unless asked for.
        let out = run(
            Command::new(exe()).args(["serve", "quic://0.0.0.0:0"]).env_remove("FERRY_TOKEN"),
            Duration::from_secs(60),
        );
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("--allow-unauthenticated"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tasks_belong_to_their_owner() {
        // Without a token, each QUIC connection is its own identity.
        let p = serve(&["quic://127.0.0.1:0"], &[]);
        assert!(p.stderr().contains("any local user can call it"), "{}", p.stderr());
        let a = client(&p.addr, None).await;
        let b = client(&p.addr, None).await;
        let id = t(a.submit("sleep", &json!({"ms": 60_000}), false)).await.unwrap();
        let unknown = "t0123456789abcdef0123456789abcdef";
        let want = t(b.task_status(unknown)).await.unwrap_err();
        assert_eq!(want.code(), Some(TASK_NOT_FOUND));
        let same = |e: ferry::ferry_rpc::CallError| {
            assert_eq!(e.code(), want.code());
            assert_eq!(e.to_string().replace(&id, "ID"), want.to_string().replace(unknown, "ID"));
        };
        same(t(b.task_status(&id)).await.unwrap_err());
        same(t(b.task_cancel(&id)).await.unwrap_err());
        same(t(b.task_result::<u64>(&id, Duration::ZERO)).await.unwrap_err());
        // The owner's task is untouched.
        assert_eq!(t(a.task_status(&id)).await.unwrap().state, TaskState::Running);
        assert_eq!(t(a.task_result::<u64>(&id, Duration::ZERO)).await.unwrap_err().code(), Some(TASK_PENDING));
        assert_eq!(t(a.task_cancel(&id)).await.unwrap().state, TaskState::Cancelled);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn token_holders_are_one_identity() {
        let p = serve(&["quic://127.0.0.1:0", "--token", "shared"], &[]);
        let a = client(&p.addr, Some("shared")).await;
        let id = t(a.submit_detached("sleep", &json!({"ms": 10}), false)).await.unwrap();
        a.close().await;
        let b = client(&p.addr, Some("shared")).await;
        assert_eq!(t(b.task_result::<u64>(&id, Duration::from_secs(10))).await.unwrap(), 10);
    }
}

/// One line of plain JSON-RPC on the abstract unix socket `addr`; the answer line.
fn plain_json(addr: &str, line: &str) -> String {
    let s = common::connect_abstract(addr);
    (&s).write_all(format!("{line}\n").as_bytes()).unwrap();
    let mut out = String::new();
    BufReader::new(&s).read_line(&mut out).unwrap();
    out.trim().to_owned()
}

/// The bytes the answer `out` has for its `id` member.
fn written_id(out: &str) -> &str {
    out.split_once(r#""id":"#).unwrap_or_else(|| panic!("no id: {out}")).1.split([',', '}']).next().unwrap()
}

#[cfg(feature = "http")]
#[test]
fn jsonrpc_exactly_over_plain_json_and_http() {
    let p = serve(&[&unique_unix(), "--http", "127.0.0.1:0"], &[]);
    let h = p.http();
    let both = |req: &str| -> [String; 2] {
        let (status, _, body) = http(&h, "POST", &[JSON, LOCAL], req);
        assert_eq!(status, 200, "{body}");
        [plain_json(&p.addr, req), body]
    };
    // Ids come back byte for byte, beyond 64 bits too.
    for id in ["18446744073709551616", "1e3", "-0", "1.50", "7", r#""x""#] {
        for out in both(&format!(r#"{{"jsonrpc":"2.0","method":"add","params":[1,2],"id":{id}}}"#)) {
            assert_eq!(written_id(&out), id, "{out}");
            assert!(out.contains(r#""result":3.0"#), "{out}");
        }
    }
    // A non-finite result is an error, not null.
    for out in both(r#"{"jsonrpc":"2.0","method":"add","params":[1e308,1e308],"id":1}"#) {
        assert_eq!(error_code(&out), -32603, "{out}");
        assert!(out.contains("inf"), "{out}");
    }
    // Duplicate members make the request invalid (not "the last one wins").
    for out in both(r#"{"jsonrpc":"2.0","method":"add","method":"sleep","params":[1,2],"id":2}"#) {
        assert_eq!(error_code(&out), -32600, "{out}");
        assert!(out.contains("more than once"), "{out}");
    }
    // An unknown by-name param is refused, named (the typo that used to return zeros).
    for out in both(r#"{"jsonrpc":"2.0","method":"create_tensor","params":{"shape":[2],"dtype":"f32","fil":7},"id":3}"#)
    {
        assert_eq!(error_code(&out), -32602, "{out}");
        assert!(out.contains(r#""path":"fil""#), "{out}");
    }
    let doc = run(Command::new(exe()).args(["discover", &p.addr]), Duration::from_secs(60));
    let doc: serde_json::Value = serde_json::from_slice(&doc.stdout).unwrap();
    let m = doc["methods"].as_array().unwrap().iter().find(|m| m["name"] == "create_tensor").unwrap();
    assert_eq!(m["x-ferry-additional-params"], false);
}

#[test]
fn a_killed_server_restarts_on_its_socket_file_and_a_live_one_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("unix:{}/api.sock", dir.path().display());
    let mut first = serve(&[&addr], &[]);
    let pid = first.child.id();
    // A second server on the same live address is refused, and told who holds it.
    let out = run(Command::new(exe()).args(["serve", &addr]), Duration::from_secs(60));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("another process listens there (pid {pid}")), "{err}");
    // SIGKILL leaves the socket file behind; a supervisor's restart must still work.
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    assert!(dir.path().join("api.sock").exists());
    let again = serve(&[&addr], &[]);
    let out = run(Command::new(exe()).args(["call", &again.addr, "add", "[1, 2]"]), Duration::from_secs(60));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "3.0", "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_clients_tasks_end_with_its_connection_unless_detached() {
    let p = serve(&[&unique_unix()], &[]);
    let call = |method: &str, params: &str| {
        let out = run(Command::new(exe()).args(["call", &p.addr, method, params]), Duration::from_secs(60));
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // Each `ferry call` is a process with its own connection, gone when it exits.
    let task_of =
        |out: &str| serde_json::from_str::<serde_json::Value>(out).unwrap()["task"].as_str().unwrap().to_owned();
    let (ok, out, err) = call("ferry.task.submit", r#"{"method": "sleep", "params": {"ms": 60000}}"#);
    assert!(ok, "{err}");
    let gone = task_of(&out);
    let (ok, out, err) = call("ferry.task.submit", r#"{"method": "sleep", "params": {"ms": 50}, "detached": true}"#);
    assert!(ok, "{err}");
    let kept = task_of(&out);
    let mut status = String::new();
    for _ in 0..100 {
        let (_, _, err) = call("ferry.task.status", &format!(r#"{{"task": "{gone}"}}"#));
        status = err;
        if status.contains("-32004") {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(status.contains("-32004"), "the task of a closed connection is still there: {status}");
    let (ok, out, err) = call("ferry.task.result", &format!(r#"{{"task": "{kept}", "wait_ms": 10000}}"#));
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "50");
}
