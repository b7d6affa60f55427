//! Parked and slow connections are closed, and connections are bounded: idle plain JSON
//! connections after `idle_timeout` (never while a call runs), a request line that does not
//! finish within `request_timeout`, HTTP connections that send no headers in time, and
//! connections over `max_connections` are refused with a message naming it; ferry pipes
//! idle for `idle_timeout` holding nothing (no call, reference or task of their own).

mod common;

use std::time::Duration;

use common::{Plain, serve, t};
use ferry_rpc::RpcLimits;
use tokio::io::{AsyncBufReadExt, AsyncReadExt};

/// Reads until the server closes the connection; the text it sent on the way.
async fn until_closed(p: &mut Plain) -> String {
    let mut out = String::new();
    t(p.read.read_to_string(&mut out)).await.unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_slow_plain_json_connections_are_closed() {
    let limits =
        RpcLimits::default().idle_timeout(Duration::from_millis(200)).request_timeout(Duration::from_millis(300));
    let fx = serve(limits).await;
    // Idle after a call: closed with nothing more said. (A connection that never sends its
    // first byte is closed by the endpoint's handshake timeout.)
    let mut idle = Plain::connect(&fx.addr).await;
    idle.send("{\"jsonrpc\":\"2.0\",\"method\":\"add\",\"params\":[1,2],\"id\":1}\n").await;
    assert_eq!(idle.line().await["result"], 3.0);
    assert_eq!(until_closed(&mut idle).await, "");
    // A call that runs longer than the idle time keeps its connection and gets its answer.
    let mut busy = Plain::connect(&fx.addr).await;
    busy.send("{\"jsonrpc\":\"2.0\",\"method\":\"sleep\",\"params\":{\"ms\":700},\"id\":1}\n").await;
    assert_eq!(busy.line().await["result"], 700);
    // Slowloris: a request started and never finished.
    let mut slow = Plain::connect(&fx.addr).await;
    slow.send("{\"jsonrpc\":\"2.0\",").await;
    let said = until_closed(&mut slow).await;
    assert!(said.contains("request_timeout"), "{said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_limit_are_refused_by_name() {
    let fx = serve(RpcLimits::default().max_connections(2)).await;
    let mut a = Plain::connect(&fx.addr).await;
    let mut b = Plain::connect(&fx.addr).await;
    for p in [&mut a, &mut b] {
        p.send("{\"jsonrpc\":\"2.0\",\"method\":\"add\",\"params\":[1,2],\"id\":1}\n").await;
        assert_eq!(p.line().await["result"], 3.0);
    }
    let mut c = Plain::connect(&fx.addr).await;
    c.send("{\"jsonrpc\":\"2.0\",\"method\":\"add\",\"params\":[1,2],\"id\":1}\n").await;
    let said = until_closed(&mut c).await;
    assert!(said.contains("max_connections = 2"), "{said}");
    // A place frees up when a connection closes.
    drop(a);
    let mut ok = false;
    for _ in 0..200 {
        let mut d = Plain::connect(&fx.addr).await;
        d.send("{\"jsonrpc\":\"2.0\",\"method\":\"add\",\"params\":[1,2],\"id\":1}\n").await;
        let mut line = String::new();
        t(d.read.read_line(&mut line)).await.unwrap();
        if line.contains("\"result\":3.0") {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(ok, "the closed connection's place was never freed");
}

#[cfg(feature = "http")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_connections_that_send_no_headers_are_closed() {
    let server = ferry_rpc::Server::builder(common::methods(Default::default()))
        .limits(RpcLimits::default().request_timeout(Duration::from_millis(300)))
        .build();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let s = server.clone();
    tokio::spawn(async move { s.serve_http(l).await });
    for partial in ["", "POST / HTTP/1.1\r\nHost: local"] {
        let mut c = t(tokio::net::TcpStream::connect(("127.0.0.1", port))).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut c, partial.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        t(c.read_to_end(&mut out)).await.unwrap();
    }
    server.shutdown();
}

/// A ferry pipe that begins a frame and trickles the rest is closed after `frame_timeout`,
/// naming it; one that idles between frames for longer stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg(target_os = "linux")] // a blocking raw socket to an abstract name
async fn a_ferry_frame_trickled_is_closed_and_an_idle_pipe_is_not() {
    use std::io::{Read, Write};

    use ferry_core::PROTOCOL_VERSION;
    use ferry_core::frame::{FrameKind, FramePrefix, PREAMBLE_LEN, PREFIX_LEN, preamble};
    use ferry_core::wire::PROTOCOL;

    let server = ferry_rpc::Server::new(common::methods(Default::default()));
    let addr = common::addr();
    let ep = ferry_core::Endpoint::builder()
        .transport(std::sync::Arc::new(ferry_local::LocalTransport::new()))
        .channel(std::sync::Arc::new(ferry_core::InlineChannel))
        .frame_timeout(Duration::from_millis(300))
        .build();
    let listener = t(ep.listen(&addr)).await.unwrap();
    let s = server.clone();
    tokio::spawn(async move {
        let _ = s.serve(listener).await;
    });
    let raw = move || {
        use std::os::linux::net::SocketAddrExt;
        let name = addr.strip_prefix("unix:").unwrap().to_owned();
        let sa = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let mut c = std::os::unix::net::UnixStream::connect_addr(&sa).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        c.write_all(&preamble(PROTOCOL_VERSION)).unwrap();
        let hello = serde_json::to_vec(&serde_json::json!({
            "protocol": PROTOCOL, "version": PROTOCOL_VERSION,
            "channels": [{"name": "inline", "devices": ["cpu"]}], "agent": "slow-test",
        }))
        .unwrap();
        let p = FramePrefix {
            kind: FrameKind::Hello as u8,
            flags: 0,
            fds: 0,
            header_len: hello.len() as u32,
            payload_len: 0,
        };
        c.write_all(&p.encode()).unwrap();
        c.write_all(&hello).unwrap();
        let mut pre = [0u8; PREAMBLE_LEN];
        c.read_exact(&mut pre).unwrap();
        let mut p = [0u8; PREFIX_LEN];
        c.read_exact(&mut p).unwrap();
        let p = FramePrefix::decode(&p);
        let mut rest = vec![0u8; p.header_len as usize + p.payload_len as usize];
        c.read_exact(&mut rest).unwrap();
        c
    };
    let call = serde_json::to_vec(&serde_json::json!({
        "header": {"jsonrpc": "2.0", "method": "add", "params": [1, 2], "id": 1}, "tensors": []
    }))
    .unwrap();
    let prefix =
        FramePrefix { kind: FrameKind::Message as u8, flags: 0, fds: 0, header_len: call.len() as u32, payload_len: 0 }
            .encode();
    let (call2, prefix2) = (call.clone(), prefix);
    tokio::task::spawn_blocking(move || {
        // Idle between frames for twice the frame timeout, then a whole call: answered.
        let mut idle = raw();
        std::thread::sleep(Duration::from_millis(600));
        idle.write_all(&prefix2).unwrap();
        idle.write_all(&call2).unwrap();
        let mut p = [0u8; PREFIX_LEN];
        idle.read_exact(&mut p).unwrap();
        let p = FramePrefix::decode(&p);
        let mut h = vec![0u8; p.header_len as usize];
        idle.read_exact(&mut h).unwrap();
        assert!(String::from_utf8_lossy(&h).contains("\"result\":3.0"), "{}", String::from_utf8_lossy(&h));
        // A frame begun and not finished: the pipe is closed, saying why.
        let mut slow = raw();
        slow.write_all(&prefix).unwrap();
        slow.write_all(&call[..call.len() / 2]).unwrap();
        let mut said = Vec::new();
        let _ = slow.read_to_end(&mut said);
        let said = String::from_utf8_lossy(&said);
        assert!(said.contains("frame_timeout"), "the server said: {said}");
    })
    .await
    .unwrap();
    server.shutdown();
}

/// One call on a raw pipe: its answer's header, or the pipe's error.
async fn call(
    pipe: &ferry_core::Pipe,
    header: serde_json::Value,
    tensors: Vec<ferry_core::Tensor>,
) -> serde_json::Value {
    t(pipe.send(ferry_core::Message::with_tensors(header, tensors))).await.unwrap();
    t(pipe.recv()).await.unwrap().header
}

/// A ferry pipe quiet for `idle_timeout` is closed naming the limit, unless it holds
/// something: a call running, or a tensor reference of its own (until it frees it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_pipe_is_closed_unless_it_holds_something() {
    let idle = Duration::from_millis(300);
    let fx = serve(RpcLimits::default().idle_timeout(idle)).await;
    let add = serde_json::json!({"jsonrpc": "2.0", "method": "add", "params": [1, 2], "id": 1});

    let quiet = t(common::endpoint().connect(&fx.addr)).await.unwrap();
    assert_eq!(call(&quiet, add.clone(), vec![]).await["result"], 3.0);
    let err = t(quiet.recv()).await.unwrap_err();
    assert!(err.to_string().contains("idle_timeout"), "{err}");

    // A call running three times the timeout: answered, then the pipe idles out.
    let busy = t(common::endpoint().connect(&fx.addr)).await.unwrap();
    let sleep = serde_json::json!({"jsonrpc": "2.0", "method": "sleep", "params": {"ms": 900}, "id": 2});
    assert_eq!(call(&busy, sleep, vec![]).await["result"], 900);
    assert!(t(busy.recv()).await.unwrap_err().to_string().contains("idle_timeout"));

    // A reference of its own keeps it open; freed, the pipe idles out.
    let keeper = t(common::endpoint().connect(&fx.addr)).await.unwrap();
    let x = ferry_core::Tensor::from_slice(vec![3u64], &[1.0f32, 2.0, 3.0]).unwrap();
    let keep = serde_json::json!({"jsonrpc": "2.0", "method": "ferry.ref.keep", "params": {"tensor": {"$tensor": 0}}, "id": 3});
    let kept = call(&keeper, keep, vec![x]).await;
    let id = kept["result"]["$tensor_ref"]["id"].as_str().unwrap().to_owned();
    tokio::time::sleep(idle * 3).await;
    assert_eq!(call(&keeper, add.clone(), vec![]).await["result"], 3.0, "a pipe holding a reference stays open");
    let free = serde_json::json!({"jsonrpc": "2.0", "method": "ferry.ref.free", "params": {"ids": [id]}, "id": 4});
    assert_eq!(call(&keeper, free, vec![]).await["result"]["freed"], 1);
    assert!(t(keeper.recv()).await.unwrap_err().to_string().contains("idle_timeout"));
}
