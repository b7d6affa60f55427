//! Parked and slow connections are closed, and connections are bounded: idle plain JSON
//! connections after `idle_timeout` (never while a call runs), a request line that does not
//! finish within `request_timeout`, HTTP connections that send no headers in time, and
//! connections over `max_connections` are refused with a message naming it.

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
