//! The send sequence (`ferry_core::pipe` module `write`), observed through a probe channel
//! over the in-memory transport: tickets are placed, then sent or aborted; CONTROL frames
//! are only pulled by the writer (behind a message, on a wake, at the time a session asked
//! for); a send dropped at any step leaves the pipe consistent.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ferry_core::inline::decode_inline;
use ferry_core::mem::MemTransport;
use ferry_core::wire::{ChannelOffer, Location};
use ferry_core::{
    Channel, ChannelError, ChannelSession, ConnInfo, ControlOut, ControlWaker, DeviceKind, Endpoint, Incoming, Limits,
    Message, Outgoing, Pipe, PipeError, PipeListener, SendTicket, SessionCtx, Tensor, TensorMeta,
};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(10);

/// One side's view of its probe session.
#[derive(Default)]
struct Probe {
    log: Mutex<Vec<String>>,
    /// CONTROL bodies `poll_control` hands out next.
    due: Mutex<Vec<Value>>,
    /// When a `{"timed": true}` body becomes due (returned by `poll_control` until then).
    at: Mutex<Option<Instant>>,
    waker: Mutex<Option<ControlWaker>>,
}

impl Probe {
    fn note(&self, s: impl Into<String>) {
        self.log.lock().unwrap().push(s.into());
    }

    fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    fn take_log(&self) -> Vec<String> {
        std::mem::take(&mut *self.log.lock().unwrap())
    }

    fn wake(&self) {
        self.waker.lock().unwrap().as_ref().expect("a session is open").wake();
    }

    /// Waits (bounded) until the log holds `n` entries; the log.
    async fn wait_log(&self, n: usize) -> Vec<String> {
        for _ in 0..1000 {
            let log = self.log();
            if log.len() >= n {
                return log;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the log never reached {n} entries: {:?}", self.log());
    }
}

/// A CPU channel that sends bytes inline and notes everything that happens to it.
struct ProbeChannel(Arc<Probe>);

impl Channel for ProbeChannel {
    fn name(&self) -> &'static str {
        "probe"
    }
    fn devices(&self) -> &'static [DeviceKind] {
        &[DeviceKind::Cpu]
    }
    fn offer(&self, _: &ConnInfo) -> Option<ChannelOffer> {
        Some(ChannelOffer { name: "probe".into(), devices: vec![DeviceKind::Cpu], domain: Default::default() })
    }
    fn accepts(&self, offer: &ChannelOffer, _: &ConnInfo) -> bool {
        offer.name == "probe"
    }
    fn open(&self, ctx: SessionCtx) -> Result<Arc<dyn ChannelSession>, ChannelError> {
        *self.0.waker.lock().unwrap() = Some(ctx.control.clone());
        Ok(Arc::new(ProbeSession(self.0.clone())))
    }
}

struct ProbeSession(Arc<Probe>);

struct ProbeTicket(Arc<Probe>);

impl SendTicket for ProbeTicket {
    fn placed(&mut self) {
        self.0.note("placed");
    }
    fn sent(self: Box<Self>) {
        self.0.note("sent");
    }
    fn aborted(self: Box<Self>) {
        self.0.note("aborted");
    }
}

#[async_trait]
impl ChannelSession for ProbeSession {
    fn name(&self) -> &'static str {
        "probe"
    }

    async fn encode(&self, tensor: &Tensor, out: &mut Outgoing) -> Result<Location, ChannelError> {
        out.ticket(|| ProbeTicket(self.0.clone()));
        Ok(Location::Inline(out.push_payload(tensor.bytes())))
    }

    async fn decode(&self, meta: TensorMeta, loc: &Location, incoming: &mut Incoming) -> Result<Tensor, ChannelError> {
        let t = decode_inline(meta, loc, incoming)?;
        self.0.note(format!("decode {}", t.nbytes()));
        Ok(t)
    }

    fn control(&self, body: &serde_json::value::RawValue, _: &mut Incoming) -> Result<(), ChannelError> {
        let text = body.get();
        self.0.note(format!("control {}", if text.len() > 40 { "(long)" } else { &text }));
        Ok(())
    }

    fn poll_control(&self, now: Instant, out: &mut Vec<ControlOut>) -> Option<Instant> {
        for body in self.0.due.lock().unwrap().drain(..) {
            out.push(ControlOut::new("probe", &body));
        }
        let mut at = self.0.at.lock().unwrap();
        if at.is_some_and(|t| t <= now) {
            *at = None;
            out.push(ControlOut::new("probe", &json!({"timed": true})));
        }
        *at
    }
}

struct Sides {
    client: Pipe,
    server: Pipe,
    c: Arc<Probe>,
    s: Arc<Probe>,
    _l: PipeListener,
}

async fn pair(tag: &str, recv_queue: usize, server_limits: Limits) -> Sides {
    let addr = format!("mem:send-sequence-{tag}-{}", std::process::id());
    let (c, s) = (Arc::new(Probe::default()), Arc::new(Probe::default()));
    let end = |p: &Arc<Probe>| {
        Endpoint::builder().transport(Arc::new(MemTransport::new())).channel(Arc::new(ProbeChannel(p.clone())))
    };
    let mut l = end(&s).recv_queue(recv_queue).limits(server_limits).build().listen(&addr).await.unwrap();
    let client = end(&c).build().connect(&addr).await.unwrap();
    let server = tokio::time::timeout(T, l.accept()).await.unwrap().unwrap();
    assert_eq!(client.channel(), "probe");
    Sides { client, server, c, s, _l: l }
}

fn msg(i: u32, bytes: usize) -> Message {
    let t = Tensor::from_slice([bytes as u64], &vec![i as u8; bytes]).unwrap();
    Message::with_tensors(json!({"i": i}), vec![t])
}

/// Blocks the server's reader: with a queue of one, its second message waits for room, and
/// nothing more is read from the connection (whose buffer then fills).
async fn block_server_reader(p: &Sides) {
    p.client.send(msg(1, 8)).await.unwrap();
    p.client.send(msg(2, 8)).await.unwrap();
    p.s.wait_log(2).await;
}

#[tokio::test]
async fn a_due_control_rides_behind_the_message_that_takes_it() {
    let p = pair("rides", 16, Limits::default()).await;
    // Due, but nobody woke the writer: only the message's write pulls it.
    p.c.due.lock().unwrap().push(json!({"k": 1}));
    p.client.send(msg(7, 100)).await.unwrap();
    assert_eq!(p.c.take_log(), ["placed", "sent"]);
    assert_eq!(p.server.recv_timeout(T).await.unwrap().header["i"], 7);
    assert_eq!(p.s.wait_log(2).await, ["decode 100", r#"control {"k":1}"#]);
}

#[tokio::test]
async fn a_woken_session_is_pulled_with_no_message_going_out() {
    let p = pair("woken", 16, Limits::default()).await;
    p.c.due.lock().unwrap().push(json!({"k": 2}));
    p.c.wake();
    assert_eq!(p.s.wait_log(1).await, [r#"control {"k":2}"#]);
    assert!(p.c.log().is_empty(), "no message, no ticket");
}

#[tokio::test]
async fn the_time_a_session_asks_for_is_kept_without_a_wake() {
    let p = pair("timed", 16, Limits::default()).await;
    *p.c.at.lock().unwrap() = Some(Instant::now() + Duration::from_millis(30));
    // One wake lets the writer learn the time; the frame then comes when it is due.
    p.c.wake();
    assert_eq!(p.s.wait_log(1).await, [r#"control {"timed":true}"#]);
}

#[tokio::test]
async fn a_message_a_limit_refuses_aborts_its_tickets_and_the_pipe_goes_on() {
    let limits = Limits { max_header_bytes: 4096, ..Limits::default() };
    let p = pair("limit", 16, limits).await;
    let mut big = msg(1, 8);
    big.header = json!({"pad": "x".repeat(8192)});
    let e = p.client.send(big).await.unwrap_err();
    assert!(matches!(e, PipeError::Limit(ref l) if l.limit == "max_header_bytes"), "{e}");
    assert_eq!(p.c.take_log(), ["placed", "aborted"]);
    p.client.send(msg(2, 8)).await.unwrap();
    assert_eq!(p.c.take_log(), ["placed", "sent"]);
    assert_eq!(p.server.recv_timeout(T).await.unwrap().header["i"], 2);
}

#[tokio::test]
async fn a_send_dropped_while_waiting_for_the_write_side_aborts_and_is_never_written() {
    let p = pair("dropped-waiting", 1, Limits::default()).await;
    block_server_reader(&p).await;
    // A CONTROL frame bigger than the transport's buffer: the writer holding it stalls.
    p.c.due.lock().unwrap().push(json!({"pad": "y".repeat(4 * ferry_core::mem::BUFFER_BYTES)}));
    p.c.wake();
    // The test's runtime has one thread: while this task sleeps, the control task takes the
    // write side and stalls in the long frame.
    tokio::time::sleep(Duration::from_millis(50)).await;
    p.c.take_log();
    let r = tokio::time::timeout(Duration::from_millis(200), p.client.send(msg(3, 8))).await;
    assert!(r.is_err(), "the send waited for the stalled write side");
    assert_eq!(p.c.take_log(), ["placed", "aborted"], "dropped before it held the write side");
    // The server reads on: the two messages, the long CONTROL frame, and then message 4,
    // never message 3.
    assert_eq!(p.server.recv_timeout(T).await.unwrap().header["i"], 1);
    assert_eq!(p.server.recv_timeout(T).await.unwrap().header["i"], 2);
    p.client.send(msg(4, 8)).await.unwrap();
    assert_eq!(p.server.recv_timeout(T).await.unwrap().header["i"], 4);
    assert_eq!(p.s.take_log(), ["decode 8", "decode 8", "control (long)", "decode 8"]);
    assert_eq!(p.c.take_log(), ["placed", "sent"]);
}

#[tokio::test]
async fn a_send_dropped_part_way_through_its_frame_closes_the_pipe_cleanly() {
    let p = pair("torn", 1, Limits::default()).await;
    block_server_reader(&p).await;
    p.c.take_log();
    let big = 4 * ferry_core::mem::BUFFER_BYTES;
    let r = tokio::time::timeout(Duration::from_millis(200), p.client.send(msg(3, big))).await;
    assert!(r.is_err(), "the send stalled part-way through its frame");
    assert_eq!(p.c.log(), ["placed"], "its fate is not known until the write side is taken again");
    // The stream has lost its frame boundaries: the next send fails, and the pipe closes.
    let e = p.client.send(msg(4, 8)).await.unwrap_err();
    assert!(e.to_string().contains("part-way"), "{e}");
    assert!(p.client.is_closed());
    assert_eq!(p.c.take_log(), ["placed", "aborted", "placed", "aborted"]);
    // The server gets what came whole, then an end: never a frame cut in two.
    assert_eq!(p.server.recv_timeout(T).await.unwrap().header["i"], 1);
    assert_eq!(p.server.recv_timeout(T).await.unwrap().header["i"], 2);
    let e = p.server.recv_timeout(T).await.unwrap_err();
    assert!(!matches!(e, PipeError::Timeout(..)), "the server saw the end: {e}");
    assert!(p.server.is_closed());
}
