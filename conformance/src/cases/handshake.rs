//! Handshake cases: the negotiated channel, refusals on both sides, limits.

use std::sync::Arc;
use std::time::Duration;

use ferry_core::wire::ChannelOffer;
use ferry_core::{
    Channel, ChannelError, ChannelSession, ConnInfo, DType, DeviceKind, Limits, Message, PipeError, Refusal,
};
use serde_json::json;

use crate::peer::RawConn;
use crate::util::{fail, pattern};
use crate::{Fixture, Outcome, ensure, run_async};

const LIMIT: Duration = Duration::from_secs(60);

/// The handshake picks the fixture's channel, on both sides.
pub fn negotiates_expected_channel<F: Fixture>(fx: &F) -> Outcome {
    run_async(LIMIT, async {
        let addr = fx.addr("negotiate");
        let ep = fx.endpoint().build();
        let mut l = ep.listen(&addr).await.map_err(fail("listen"))?;
        let c = ep.connect(&addr).await.map_err(fail("connect"))?;
        let s = l.accept().await.map_err(fail("accept"))?;
        ensure!(c.channel() == fx.expected_channel(), "client got {:?}", c.channel());
        ensure!(s.channel() == fx.expected_channel(), "server got {:?}", s.channel());
        ensure!(s.info().is_server && !c.info().is_server, "roles wrong");
        Ok(())
    })
}

/// A client speaking protocol version 99 is refused, and both sides say why.
pub fn version_mismatch<F: Fixture>(fx: &F) -> Outcome {
    run_async(LIMIT, async {
        let addr = fx.addr("version");
        let mut l = fx.endpoint().build().listen(&addr).await.map_err(fail("listen"))?;
        let r = fx.endpoint().protocol_version(99).build().connect(&addr).await;
        let want = Refusal::VersionMismatch { server: ferry_core::PROTOCOL_VERSION, client: 99 };
        ensure!(matches!(&r, Err(PipeError::Refused(x)) if *x == want), "client got {r:?}");
        let s = l.accept().await;
        ensure!(matches!(&s, Err(PipeError::Refused(x)) if *x == want), "server got {s:?}");
        let text = r.err().map(|e| e.to_string()).unwrap_or_default();
        ensure!(text.contains("server speaks") && text.contains("99"), "unclear message: {text}");
        Ok(())
    })
}

/// A channel only the client has.
struct Unshared;

impl Channel for Unshared {
    fn name(&self) -> &'static str {
        "conformance-unshared"
    }
    fn devices(&self) -> &'static [DeviceKind] {
        &[DeviceKind::Cpu]
    }
    fn offer(&self, _: &ConnInfo) -> Option<ChannelOffer> {
        Some(ChannelOffer { name: self.name().into(), devices: vec![DeviceKind::Cpu], domain: Default::default() })
    }
    fn accepts(&self, _: &ChannelOffer, _: &ConnInfo) -> bool {
        true
    }
    fn open(&self, _: ferry_core::SessionCtx) -> Result<Arc<dyn ChannelSession>, ChannelError> {
        Err(ChannelError::NotViable("test channel".into()))
    }
}

/// A client whose only channel the server lacks is refused on both sides.
pub fn no_common_channel<F: Fixture>(fx: &F) -> Outcome {
    run_async(LIMIT, async {
        let addr = fx.addr("no-common");
        let mut l = fx.endpoint().build().listen(&addr).await.map_err(fail("listen"))?;
        let client = ferry_core::Endpoint::builder().transport(fx.transport()).channel(Arc::new(Unshared)).build();
        let r = client.connect(&addr).await;
        ensure!(matches!(&r, Err(PipeError::Refused(Refusal::NoCommonChannel { .. }))), "client got {r:?}");
        let s = l.accept().await;
        ensure!(matches!(&s, Err(PipeError::Refused(Refusal::NoCommonChannel { .. }))), "server got {s:?}");
        let text = r.err().map(|e| e.to_string()).unwrap_or_default();
        ensure!(text.contains("conformance-unshared"), "message does not name the offer: {text}");
        Ok(())
    })
}

/// A server that requires a token refuses a missing or wrong one and accepts the right one.
pub fn bad_token<F: Fixture>(fx: &F) -> Outcome {
    run_async(LIMIT, async {
        let addr = fx.addr("token");
        let mut l = fx.endpoint().require_token("s3cret").build().listen(&addr).await.map_err(fail("listen"))?;
        for token in [None, Some("s3creT"), Some("")] {
            let mut b = fx.endpoint();
            if let Some(t) = token {
                b = b.token(t);
            }
            let r = b.build().connect(&addr).await;
            ensure!(matches!(r, Err(PipeError::Refused(Refusal::BadToken))), "token {token:?}: client got {r:?}");
            let s = l.accept().await;
            ensure!(matches!(s, Err(PipeError::Refused(Refusal::BadToken))), "token {token:?}: server got {s:?}");
        }
        let c = fx.endpoint().token("s3cret").build().connect(&addr).await.map_err(fail("right token"))?;
        let s = l.accept().await.map_err(fail("accept"))?;
        c.send(Message::new(json!("in"))).await.map_err(fail("send"))?;
        ensure!(s.recv_timeout(Duration::from_secs(10)).await.is_ok(), "no message after auth");
        Ok(())
    })
}

/// A message over the server's announced limits fails on the client before it is sent,
/// naming the limit; the pipe stays usable.
pub fn send_over_peer_limit<F: Fixture>(fx: &F) -> Outcome {
    run_async(LIMIT, async {
        let addr = fx.addr("peer-limit");
        let limits =
            Limits { max_payload_bytes: 1 << 20, max_header_bytes: 1 << 20, max_tensors: 8, ..Limits::default() };
        let mut l = fx.endpoint().limits(limits).build().listen(&addr).await.map_err(fail("listen"))?;
        let c = fx.endpoint().build().connect(&addr).await.map_err(fail("connect"))?;
        let s = l.accept().await.map_err(fail("accept"))?;
        let big_header = Message::new(json!({ "text": "x".repeat(2 << 20) }));
        let r = c.send(big_header).await;
        ensure!(matches!(&r, Err(PipeError::Limit(e)) if e.limit == "max_header_bytes"), "big header gave {r:?}");
        let text = r.err().map(|e| e.to_string()).unwrap_or_default();
        ensure!(text.contains("max_header_bytes") && text.contains("raise it"), "unclear message: {text}");
        if c.channel() == "inline" {
            // Inline tensors travel in the payload, so the payload limit applies to them.
            let big = Message::with_tensors(json!(1), vec![pattern(DType::U8, &[2 << 20], 1)]);
            let r = c.send(big).await;
            ensure!(matches!(&r, Err(PipeError::Limit(e)) if e.limit == "max_payload_bytes"), "big send gave {r:?}");
        }
        let many = Message::with_tensors(json!(2), (0..9).map(|i| pattern(DType::U8, &[1], i)).collect());
        let r = c.send(many).await;
        ensure!(matches!(&r, Err(PipeError::Limit(e)) if e.limit == "max_tensors"), "many-tensor send gave {r:?}");
        c.send(Message::new(json!("small"))).await.map_err(fail("small send"))?;
        let m = s.recv_timeout(Duration::from_secs(10)).await.map_err(fail("recv"))?;
        ensure!(m.header == json!("small"), "pipe not usable after a refused send");
        Ok(())
    })
}

/// A client that connects and says nothing is dropped after the handshake timeout, and
/// does not stall other clients meanwhile.
pub fn silent_client_times_out<F: Fixture>(fx: &F) -> Outcome {
    run_async(LIMIT, async {
        let addr = fx.addr("silent");
        let ep = fx.endpoint().handshake_timeout(Duration::from_millis(500)).build();
        let mut l = ep.listen(&addr).await.map_err(fail("listen"))?;
        let _silent = RawConn::connect(fx, &addr).await?;
        let c = fx.endpoint().build().connect(&addr).await.map_err(fail("second client"))?;
        let first = l.accept().await;
        ensure!(first.is_ok(), "the good client should be accepted first, got {first:?}");
        let second = l.accept().await;
        // The endpoint's handshake timer, or (for transports that wait for the client's
        // first bytes before yielding a connection, like QUIC) the transport's own.
        let timed_out = match &second {
            Err(PipeError::Timeout(..)) => true,
            Err(PipeError::Transport(e)) => e.to_string().contains("within"),
            _ => false,
        };
        ensure!(timed_out, "silent client gave {second:?}");
        drop(c);
        Ok(())
    })
}

/// A client announcing small receive limits never gets more from the server: the server's
/// send fails early, naming the limit.
pub fn server_respects_client_limits<F: Fixture>(fx: &F) -> Outcome {
    run_async(LIMIT, async {
        let addr = fx.addr("client-limit");
        let mut l = fx.endpoint().build().listen(&addr).await.map_err(fail("listen"))?;
        let limits = Limits { max_payload_bytes: 4096, ..Limits::default() };
        let c = fx.endpoint().limits(limits).build().connect(&addr).await.map_err(fail("connect"))?;
        let s = l.accept().await.map_err(fail("accept"))?;
        let r = s.send(Message::with_tensors(json!(1), vec![pattern(DType::U8, &[8192], 1)])).await;
        ensure!(matches!(&r, Err(PipeError::Limit(e)) if e.limit == "max_payload_bytes"), "server send gave {r:?}");
        s.send(Message::with_tensors(json!(2), vec![pattern(DType::U8, &[100], 2)])).await.map_err(fail("small"))?;
        let m = c.recv_timeout(Duration::from_secs(10)).await.map_err(fail("recv"))?;
        ensure!(m.header == json!(2), "wrong message");
        Ok(())
    })
}

/// Offers a newer peer might make (an unknown device kind, an unknown channel) are
/// ignored, not refused.
pub fn unknown_offers_are_ignored<F: Fixture>(fx: &F) -> Outcome {
    run_async(LIMIT, async {
        let addr = fx.addr("unknown-offers");
        let mut l = fx.endpoint().build().listen(&addr).await.map_err(fail("listen"))?;
        let mut raw = RawConn::connect(fx, &addr).await?;
        let offers = json!([
            {"name": "teleport", "devices": ["quantum"], "domain": {"galaxy": "m31"}},
            {"name": "inline", "devices": ["cpu", "quantum"]}
        ]);
        let w = raw.handshake_with(offers).await?;
        ensure!(w.channels.get(&DeviceKind::Cpu).map(String::as_str) == Some("inline"), "welcome {w:?}");
        ensure!(l.accept().await.is_ok(), "server side failed");
        Ok(())
    })
}

/// With `accept_foreign`, a plain newline-delimited JSON client on the same socket is handed
/// over intact (every byte it sent still readable), and ferry clients still work beside it.
pub fn foreign_json_is_handed_over<F: Fixture>(fx: &F) -> Outcome {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    run_async(LIMIT, async {
        let addr = fx.addr("foreign");
        let mut l = fx.endpoint().accept_foreign(true).build().listen(&addr).await.map_err(fail("listen"))?;
        let mut raw = RawConn::connect(fx, &addr).await?;
        let request = b"{\"jsonrpc\":\"2.0\",\"method\":\"ping\",\"id\":1}\n";
        raw.write_raw(request).await?;
        let mut conn = match l.accept_any().await.map_err(fail("accept_any"))? {
            ferry_core::Accepted::Foreign(c) => c,
            ferry_core::Accepted::Pipe(_) => return Err("a JSON client was taken for a ferry pipe".into()),
        };
        let mut line = String::new();
        conn.read.read_line(&mut line).await.map_err(|e| format!("read: {e}"))?;
        ensure!(line.as_bytes() == request, "bytes lost: {line:?}");
        conn.write
            .write_all(b"{\"jsonrpc\":\"2.0\",\"result\":\"pong\",\"id\":1}\n")
            .await
            .map_err(|e| format!("{e}"))?;
        let mut back = String::new();
        let mut r = raw.reader.into_inner();
        r.read_line(&mut back).await.map_err(|e| format!("read reply: {e}"))?;
        ensure!(back.contains("pong"), "reply {back:?}");
        let c = fx.endpoint().build().connect(&addr).await.map_err(fail("ferry client beside it"))?;
        let s = l.accept_any().await.map_err(fail("accept pipe"))?;
        ensure!(matches!(s, ferry_core::Accepted::Pipe(_)), "ferry client not accepted as a pipe");
        drop(c);
        Ok(())
    })
}

/// A client that hangs up in the middle of the handshake is reported as such, and the
/// listener goes on serving (only `Closed` means the listener stopped).
pub fn hangup_during_handshake_is_not_listener_closed<F: Fixture>(fx: &F) -> Outcome {
    run_async(LIMIT, async {
        let addr = fx.addr("hangup");
        let mut l = fx.endpoint().build().listen(&addr).await.map_err(fail("listen"))?;
        let mut raw = RawConn::connect(fx, &addr).await?;
        raw.write_raw(&ferry_core::frame::preamble(ferry_core::PROTOCOL_VERSION)).await?;
        drop(raw);
        let r = l.accept().await;
        ensure!(matches!(&r, Err(e) if !matches!(e, PipeError::Closed)), "a hung-up client gave {r:?}");
        let c = fx.endpoint().build().connect(&addr).await.map_err(fail("next client"))?;
        ensure!(l.accept().await.is_ok(), "the listener stopped after a client hung up");
        drop(c);
        Ok(())
    })
}
