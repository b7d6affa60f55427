//! RPC over QUIC with the same client API: `ferry serve quic://...` prints its pinned
//! address; `ferry call` and the Rust client use it like any other address.
#![cfg(all(feature = "rpc", feature = "quic"))]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{exe, run};
use ferry::ferry_rpc::{Client, RpcTensor};
use ferry::{DType, Tensor, TensorMeta};
use serde_json::{Value, json};

struct Serve(Child, std::path::PathBuf);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

fn serve_quic() -> (Serve, String) {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let home = std::env::temp_dir().join(format!("ferry-quic-rpc-home-{}-{n}", std::process::id()));
    let mut child = Command::new(exe())
        .args(["serve", "quic://127.0.0.1:0"])
        .env("XDG_CONFIG_HOME", &home)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut l = String::new();
        let _ = BufReader::new(out).read_line(&mut l);
        let _ = tx.send(l);
    });
    let line = rx.recv_timeout(Duration::from_secs(30)).expect("ferry serve printed nothing");
    let addr = line.trim().strip_prefix("listening on ").expect("listening on ADDR").to_string();
    assert!(addr.starts_with("quic://127.0.0.1:") && addr.contains("#sha256="), "{addr}");
    // The identity was created in the (temporary) config directory, private.
    let id = home.join("ferry/quic-identity.pem");
    assert!(id.is_file(), "no identity at {}", id.display());
    #[cfg(unix)]
    {
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&id).unwrap().permissions());
        assert_eq!(mode & 0o777, 0o600);
    }
    (Serve(child, home), addr)
}

#[test]
fn ferry_call_over_quic() {
    let (_s, addr) = serve_quic();
    let out = run(Command::new(exe()).args(["call", &addr, "add", "[1, 2]"]), Duration::from_secs(60));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "3.0");
    let out = run(Command::new(exe()).args(["discover", &addr]), Duration::from_secs(60));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["openrpc"], "1.3.2");
    // Without the pin the client refuses to talk to an unverified server.
    let bare = addr.split('#').next().unwrap();
    let out = run(Command::new(exe()).args(["call", bare, "add", "[1, 2]"]), Duration::from_secs(60));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("#sha256="));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_client_over_quic_with_tensors() {
    let (_s, addr) = serve_quic();
    let t = |f| tokio::time::timeout(Duration::from_secs(60), f);
    let pipe = t(ferry::endpoint().build().connect(&addr)).await.unwrap().unwrap();
    assert_eq!((pipe.transport(), pipe.channel()), ("quic", "quic"));
    let c = Client::new(pipe);
    let sum: f64 =
        tokio::time::timeout(Duration::from_secs(60), c.call("add", &json!({"a": 2, "b": 3}))).await.unwrap().unwrap();
    assert_eq!(sum, 5.0);
    let data: Vec<f32> = (0..(1 << 20)).map(|i| i as f32).collect();
    let x = Tensor::from_slice(vec![1 << 20], &data).unwrap();
    #[derive(serde::Serialize)]
    struct Echo {
        tensor: RpcTensor,
    }
    let back: RpcTensor =
        tokio::time::timeout(Duration::from_secs(60), c.call("echo", &Echo { tensor: RpcTensor(x.clone()) }))
            .await
            .unwrap()
            .unwrap();
    let back: Tensor = back.0;
    assert_eq!(back.meta(), &TensorMeta::new(DType::F32, vec![1 << 20]));
    assert_eq!(back.as_slice::<f32>().unwrap()[12345], 12345.0);
}
