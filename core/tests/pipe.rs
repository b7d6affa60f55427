//! Pipe and endpoint behaviour over the in-memory transport ([`ferry_core::mem`]): the
//! handshake's outcomes as each side sees them, messages with tensors, closing, and the
//! transport's own name table. No socket and no other process.

use std::sync::Arc;
use std::time::Duration;

use ferry_core::mem::MemTransport;
use ferry_core::{
    Endpoint, EndpointBuilder, InlineChannel, Message, Pipe, PipeError, PipeListener, Refusal, Tensor, TransportError,
};
use serde_json::json;

const T: Duration = Duration::from_secs(10);

fn endpoint() -> EndpointBuilder {
    Endpoint::builder().transport(Arc::new(MemTransport::new())).channel(Arc::new(InlineChannel))
}

fn addr(tag: &str) -> String {
    format!("mem:pipe-test-{tag}-{}", std::process::id())
}

/// A connected (client, server) pair on a fresh name.
async fn pair(tag: &str) -> (Pipe, Pipe, PipeListener) {
    let a = addr(tag);
    let mut l = endpoint().build().listen(&a).await.unwrap();
    let client = endpoint().build().connect(&a).await.unwrap();
    let server = tokio::time::timeout(T, l.accept()).await.unwrap().unwrap();
    (client, server, l)
}

#[tokio::test]
async fn messages_with_tensors_go_both_ways_in_order() {
    let (client, server, _l) = pair("round-trip").await;
    assert_eq!(client.info().channels[&ferry_core::DeviceKind::Cpu], "inline");
    assert!(server.info().is_server && !client.info().is_server);
    for i in 0..50u32 {
        let t = Tensor::from_slice([3], &[i as f32, 1.5, -2.0]).unwrap();
        client.send(Message::with_tensors(json!({"i": i}), vec![t])).await.unwrap();
    }
    for i in 0..50u32 {
        let m = server.recv_timeout(T).await.unwrap();
        assert_eq!(m.header["i"], i);
        assert_eq!(m.tensors[0].as_slice::<f32>().unwrap(), &[i as f32, 1.5, -2.0]);
        server.send(m).await.unwrap();
    }
    for i in 0..50u32 {
        assert_eq!(client.recv_timeout(T).await.unwrap().header["i"], i);
    }
}

#[tokio::test]
async fn a_wrong_token_is_refused_on_both_sides() {
    let a = addr("token");
    let mut l = endpoint().require_token("secret").build().listen(&a).await.unwrap();
    let e = endpoint().token("guess").build().connect(&a).await.unwrap_err();
    assert!(matches!(e, PipeError::Refused(Refusal::BadToken)), "{e}");
    let Err(e) = tokio::time::timeout(T, l.accept()).await.unwrap() else { panic!("accepted a wrong token") };
    assert!(matches!(e, PipeError::Refused(Refusal::BadToken)), "the server's side: {e}");
    // The listener goes on: a client with the token gets in.
    let ok = endpoint().token("secret").build().connect(&a).await.unwrap();
    let s = tokio::time::timeout(T, l.accept()).await.unwrap().unwrap();
    assert!(s.info().token_verified);
    ok.send(Message::new(json!("hi"))).await.unwrap();
    assert_eq!(s.recv_timeout(T).await.unwrap().header, json!("hi"));
}

#[tokio::test]
async fn a_version_mismatch_is_refused_by_name() {
    let a = addr("version");
    let _l = endpoint().protocol_version(2).build().listen(&a).await.unwrap();
    let e = endpoint().build().connect(&a).await.unwrap_err();
    assert!(matches!(e, PipeError::Refused(Refusal::VersionMismatch { server: 2, client: 1 })), "{e}");
}

#[tokio::test]
async fn closing_one_end_ends_the_other() {
    let (client, server, _l) = pair("close").await;
    client.send(Message::new(json!(1))).await.unwrap();
    client.close().await;
    // What was sent before the close still arrives, then the end.
    assert_eq!(server.recv_timeout(T).await.unwrap().header, json!(1));
    let e = server.recv_timeout(T).await.unwrap_err();
    assert!(matches!(e, PipeError::Closed | PipeError::ClosedByPeer(_)), "{e:?}");
}

#[tokio::test]
async fn names_are_taken_refused_and_freed() {
    let a = addr("names");
    let l = endpoint().build().listen(&a).await.unwrap();
    let Err(e) = endpoint().build().listen(&a).await else { panic!("a second listener on {a}") };
    assert!(matches!(e, PipeError::Transport(TransportError::AddrInUse { .. })), "{e}");
    drop(l);
    // Dropped (its accept task ends on the runtime's next turn): nobody listens, and the
    // name can be taken again. A connection made in that turn sees the listener close.
    let mut freed = false;
    for _ in 0..100 {
        match endpoint().build().connect(&a).await {
            Err(PipeError::Transport(TransportError::NotListening { .. })) => {
                freed = true;
                break;
            }
            Err(PipeError::Closed) => tokio::time::sleep(Duration::from_millis(10)).await,
            other => panic!("connecting to a dropped listener: {:?}", other.err()),
        }
    }
    assert!(freed, "the dropped listener's name still took connections after 1 s");
    let _again = endpoint().build().listen(&a).await.unwrap();
    let Err(e) = endpoint().build().connect("mem:").await else { panic!("connected to mem:") };
    assert!(e.to_string().contains("nothing after the scheme"), "{e}");
}
