//! QUIC across real network paths: a lossy, delayed path (a UDP relay dropping 1% of the
//! datagrams each way and delaying each by 5 ms), and two network namespaces joined by a
//! veth pair, clean and (where the kernel has netem) with 1% loss and 5 ms delay. Data must
//! arrive intact. Namespace cases need root and `ip netns`; they show as ignored otherwise.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::Duration;

use ferry_core::{DType, Endpoint, InlineChannel, Message, Pipe, Tensor, TensorMeta, TensorMut};
use ferry_quic::{IdentitySource, QuicChannel, QuicOptions, QuicTransport};
use libtest_mimic::{Arguments, Failed, Trial};
use serde_json::json;
use tokio::net::UdpSocket;

const ROLE: &str = "FERRY_QUIC_NET_ROLE";
const ADDR: &str = "FERRY_QUIC_NET_ADDR";

fn endpoint() -> Endpoint {
    let opts = QuicOptions { identity: IdentitySource::Ephemeral, ..QuicOptions::default() };
    Endpoint::builder()
        .transport(Arc::new(QuicTransport::with_options(opts)))
        .channel(Arc::new(QuicChannel::new()))
        .channel(Arc::new(InlineChannel))
        .build()
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

fn pattern(n: u64, seed: u64) -> Tensor {
    let mut t = TensorMut::zeros(TensorMeta::new(DType::U8, vec![n])).expect("shape");
    let mut x = seed | 1;
    for b in t.as_bytes_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    t.freeze()
}

/// Message shapes for a fast path: up to 16 MiB tensors.
const BIG: &[&[u64]] = &[&[], &[1024], &[1 << 20], &[16 << 20], &[8 << 20, 8 << 20, 100]];
/// For a lossy path (1% loss at 10 ms RTT allows about 1.5 MB/s): a few MiB.
const SMALL: &[&[u64]] = &[&[], &[1024], &[1 << 20], &[2 << 20], &[1 << 20, 1 << 20, 100]];

/// Sends messages of several sizes and checks each echo byte for byte.
async fn exercise(pipe: &Pipe, sizes: &[&[u64]]) -> Result<u64, String> {
    let mut moved = 0;
    for (i, sz) in sizes.iter().enumerate() {
        let tensors: Vec<Tensor> = sz.iter().enumerate().map(|(j, &n)| pattern(n, (i * 10 + j) as u64 + 1)).collect();
        moved += tensors.iter().map(|t| t.nbytes() as u64).sum::<u64>();
        let msg = Message::with_tensors(json!({"i": i}), tensors);
        pipe.send(msg.clone()).await.map_err(|e| format!("send {i}: {e}"))?;
        let back = pipe.recv_timeout(Duration::from_secs(120)).await.map_err(|e| format!("recv {i}: {e}"))?;
        if back != msg {
            return Err(format!("message {i} came back different"));
        }
    }
    Ok(moved)
}

async fn echo_server(addr: &str, announce: impl FnOnce(String)) -> Result<(), String> {
    let mut l = endpoint().listen(addr).await.map_err(|e| e.to_string())?;
    announce(l.local_addr().to_string());
    loop {
        let p = l.accept().await.map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            while let Ok(m) = p.recv().await {
                if p.send(m).await.is_err() {
                    break;
                }
            }
        });
    }
}

/// A UDP relay that drops `loss` of the datagrams each way and delays each by `delay`
/// (keeping their order, as a real path would).
async fn lossy_relay(upstream: SocketAddr, loss: f64, delay: Duration) -> std::io::Result<SocketAddr> {
    let front = Arc::new(UdpSocket::bind("127.0.0.1:0").await?);
    let back = Arc::new(UdpSocket::bind("127.0.0.1:0").await?);
    back.connect(upstream).await?;
    let at = front.local_addr()?;
    let client = Arc::new(std::sync::Mutex::new(None::<SocketAddr>));
    let threshold = (loss * u32::MAX as f64) as u32;
    let mut x = 0x9E37_79B9_u32;
    let mut drop_it = move || {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        x < threshold
    };
    let mut drop_back = drop_it;
    type Queue = tokio::sync::mpsc::UnboundedSender<(tokio::time::Instant, Vec<u8>)>;
    let delayed = |send: Box<dyn Fn(Vec<u8>) + Send>| -> Queue {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
        tokio::spawn(async move {
            while let Some((at, pkt)) = rx.recv().await {
                tokio::time::sleep_until(at).await;
                send(pkt);
            }
        });
        tx
    };
    let b2 = back.clone();
    let to_server = delayed(Box::new(move |p| {
        let _ = b2.try_send(&p);
    }));
    let (f2, c2) = (front.clone(), client.clone());
    let to_client = delayed(Box::new(move |p| {
        if let Some(to) = *c2.lock().unwrap_or_else(|e| e.into_inner()) {
            let _ = f2.try_send_to(&p, to);
        }
    }));
    let (f, c) = (front.clone(), client.clone());
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65536];
        while let Ok((n, from)) = f.recv_from(&mut buf).await {
            *c.lock().unwrap_or_else(|e| e.into_inner()) = Some(from);
            if !drop_it() {
                let _ = to_server.send((tokio::time::Instant::now() + delay, buf[..n].to_vec()));
            }
        }
    });
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65536];
        while let Ok(n) = back.recv(&mut buf).await {
            if !drop_back() {
                let _ = to_client.send((tokio::time::Instant::now() + delay, buf[..n].to_vec()));
            }
        }
    });
    Ok(at)
}

fn lossy_path() -> Result<(), Failed> {
    rt().block_on(async {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let server = tokio::spawn(echo_server("quic://127.0.0.1:0", move |a| {
            let _ = tx.send(a);
        }));
        let addr = rx.await.map_err(|_| "server did not start")?;
        let (sock, pin) = addr.trim_start_matches("quic://").split_once('#').ok_or("no pin")?;
        let relay = lossy_relay(sock.parse().map_err(|e| format!("{e}"))?, 0.01, Duration::from_millis(5))
            .await
            .map_err(|e| e.to_string())?;
        let pipe = endpoint().connect(&format!("quic://{relay}#{pin}")).await.map_err(|e| e.to_string())?;
        let start = std::time::Instant::now();
        let moved = exercise(&pipe, SMALL).await?;
        println!("lossy path (1% loss each way, 5 ms delay): {moved} bytes echoed intact in {:?}", start.elapsed());
        server.abort();
        Ok(())
    })
}

/// Two namespaces joined by a veth pair; removed on drop.
struct Netns {
    a: String,
    b: String,
    ip_a: String,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

impl Netns {
    fn create() -> Result<Netns, String> {
        let id = std::process::id() % 10_000;
        let (a, b) = (format!("ferry-qa-{id}"), format!("ferry-qb-{id}"));
        let (va, vb) = (format!("fqa{id}"), format!("fqb{id}"));
        let octet = 1 + id % 250;
        let ns = Netns { a: a.clone(), b: b.clone(), ip_a: format!("10.77.{octet}.1") };
        ip(&["netns", "add", &a])?;
        ip(&["netns", "add", &b])?;
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])?;
        ip(&["link", "set", &va, "netns", &a])?;
        ip(&["link", "set", &vb, "netns", &b])?;
        ip(&["-n", &a, "addr", "add", &format!("10.77.{octet}.1/24"), "dev", &va])?;
        ip(&["-n", &b, "addr", "add", &format!("10.77.{octet}.2/24"), "dev", &vb])?;
        for (n, v) in [(&a, &va), (&b, &vb)] {
            ip(&["-n", n, "link", "set", v, "up"])?;
            ip(&["-n", n, "link", "set", "lo", "up"])?;
        }
        Ok(ns)
    }

    fn veth_b(&self) -> String {
        format!("fqb{}", std::process::id() % 10_000)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}

struct Kid(std::process::Child);

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn in_netns(ns: &str, role: &str, addr: &str) -> Result<(Kid, BufReader<std::process::ChildStdout>), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut c = Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(exe)
        .env(ROLE, role)
        .env(ADDR, addr)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("ip netns exec: {e}"))?;
    let out = c.stdout.take().ok_or("no stdout")?;
    Ok((Kid(c), BufReader::new(out)))
}

fn read_line(r: &mut BufReader<std::process::ChildStdout>) -> String {
    let mut l = String::new();
    let _ = r.read_line(&mut l);
    l.trim().to_string()
}

fn across_namespaces(netem: bool) -> Result<(), Failed> {
    let ns = Netns::create()?;
    if netem {
        let dev = ns.veth_b();
        let out = Command::new("ip")
            .args([
                "netns", "exec", &ns.b, "tc", "qdisc", "add", "dev", &dev, "root", "netem", "loss", "1%", "delay",
                "5ms",
            ])
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!("tc netem: {}", String::from_utf8_lossy(&out.stderr)).into());
        }
    }
    let (_server, mut sout) = in_netns(&ns.a, "server", &format!("quic://{}:0", ns.ip_a))?;
    let line = read_line(&mut sout);
    let addr = line.strip_prefix("ready ").ok_or_else(|| format!("server said {line:?}"))?.to_string();
    let (mut client, mut cout) = in_netns(&ns.b, if netem { "client-lossy" } else { "client" }, &addr)?;
    let line = read_line(&mut cout);
    let _ = client.0.wait();
    if !line.starts_with("ok ") {
        return Err(format!("client in the other namespace said {line:?}").into());
    }
    println!("namespaces {} -> {} ({}): {}", ns.b, ns.a, if netem { "netem 1% loss, 5 ms" } else { "clean" }, line);
    Ok(())
}

fn child(role: &str, addr: &str) -> ExitCode {
    std::thread::spawn(|| {
        let _ = std::io::stdin().read(&mut [0u8; 1]);
        std::process::exit(0);
    });
    let r = rt().block_on(async {
        match role {
            "server" => echo_server(addr, |a| println!("ready {a}")).await,
            "client" | "client-lossy" => {
                let pipe = endpoint().connect(addr).await.map_err(|e| e.to_string())?;
                let start = std::time::Instant::now();
                let moved = exercise(&pipe, if role == "client-lossy" { SMALL } else { BIG }).await?;
                println!("ok {moved} bytes echoed intact in {:?}", start.elapsed());
                Ok(())
            }
            other => Err(format!("unknown role {other}")),
        }
    });
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            println!("error {e}");
            ExitCode::FAILURE
        }
    }
}

fn netns_usable() -> Result<(), String> {
    let probe = format!("ferry-probe-{}", std::process::id());
    ip(&["netns", "add", &probe])
        .map_err(|e| format!("`ip netns` is unavailable here ({e}); needs root and iproute2"))?;
    let _ = ip(&["netns", "del", &probe]);
    Ok(())
}

fn netem_usable() -> Result<(), String> {
    let ns = Netns::create()?;
    let out = Command::new("ip")
        .args(["netns", "exec", &ns.b, "tc", "qdisc", "add", "dev", &ns.veth_b(), "root", "netem", "delay", "1ms"])
        .output()
        .map_err(|e| format!("tc: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "this kernel has no netem qdisc ({}); the lossy-relay case covers loss and delay instead",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn main() -> ExitCode {
    if let (Ok(role), Ok(addr)) = (std::env::var(ROLE), std::env::var(ADDR)) {
        return child(&role, &addr);
    }
    let mut args = Arguments::from_args();
    args.test_threads = Some(1);
    let ns = netns_usable();
    let netem = ns.clone().and_then(|()| netem_usable());
    for (what, r) in [("namespace cases", &ns), ("netem case", &netem)] {
        if let Err(why) = r {
            eprintln!("ferry-quic network tests: {what} ignored: {why}");
        }
    }
    let trials = vec![
        Trial::test("lossy_relay_1pct_loss_5ms_delay", lossy_path),
        Trial::test("netns_veth_clean", || across_namespaces(false)).with_ignored_flag(ns.is_err()),
        Trial::test("netns_veth_netem_1pct_loss_5ms", || across_namespaces(true)).with_ignored_flag(netem.is_err()),
    ];
    libtest_mimic::run(&args, trials).exit_code()
}
