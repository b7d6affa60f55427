//! The handshake as plain functions (sans-IO): what the client offers
//! ([`client_hello`]), the server's whole decision on a HELLO ([`server_decide`]: the
//! preamble cross-check, the bearer token, then [`server_choose`]), and the client's checks
//! of the WELCOME ([`client_accept`]). The server's choice is authoritative; the client
//! never recomputes it, it only checks that the choice is one it offered.
//! `endpoint.rs` does the IO around them: preambles, frames, opening the sessions.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::channel::Channel;
use crate::dtype::DeviceKind;
use crate::error::ProtocolError;
use crate::transport::ConnInfo;
use crate::wire::FEATURES;
use crate::wire::{Hello, Limits, PROTOCOL, Refusal, Welcome};

/// The agent string this build sends.
pub fn agent() -> String {
    format!("ferry-rust/{}", env!("CARGO_PKG_VERSION"))
}

/// Builds the client's HELLO: every viable channel that can work over `conn`, in priority
/// order.
pub fn client_hello(
    channels: &[Arc<dyn Channel>],
    conn: &ConnInfo,
    version: u16,
    token: Option<String>,
    limits: Limits,
) -> Hello {
    Hello {
        protocol: PROTOCOL.into(),
        version,
        channels: channels.iter().filter(|c| c.viability().is_ok()).filter_map(|c| c.offer(conn)).collect(),
        token,
        agent: agent(),
        limits: Some(limits),
        features: FEATURES.iter().map(|f| (*f).to_string()).collect(),
    }
}

/// The server's decision: for each device kind, its highest-priority viable channel that the
/// client offered and that accepts the client's offer. CPU tensors must have a channel.
pub fn server_choose(
    channels: &[Arc<dyn Channel>],
    hello: &Hello,
    conn: &ConnInfo,
    version: u16,
    limits: Limits,
) -> Result<Welcome, Refusal> {
    if hello.protocol != PROTOCOL {
        return Err(Refusal::Malformed { detail: format!("protocol is {:?}, expected {PROTOCOL:?}", hello.protocol) });
    }
    if hello.version != version {
        return Err(Refusal::VersionMismatch { server: version, client: hello.version });
    }
    let mut chosen = BTreeMap::new();
    for kind in [DeviceKind::Cpu, DeviceKind::Cuda] {
        let pick = channels.iter().filter(|c| c.devices().contains(&kind) && c.viability().is_ok()).find(|c| {
            hello.channels.iter().any(|o| o.name == c.name() && o.devices.contains(&kind) && c.accepts(o, conn))
        });
        if let Some(c) = pick {
            chosen.insert(kind, c.name().to_string());
        }
    }
    if !chosen.contains_key(&DeviceKind::Cpu) {
        return Err(Refusal::NoCommonChannel {
            offered: hello.channels.iter().map(|o| o.name.clone()).collect(),
            supported: channels.iter().map(|c| c.name().to_string()).collect(),
        });
    }
    let features =
        FEATURES.iter().filter(|f| hello.features.iter().any(|h| h == *f)).map(|f| (*f).to_string()).collect();
    Ok(Welcome { version, channels: chosen, limits, agent: agent(), features, ring: None })
}

/// What a server holds to by: its channels (highest priority first), protocol version,
/// limits and the bearer token it requires, if any.
#[derive(Clone, Copy)]
pub struct ServerPolicy<'a> {
    /// Channels, highest priority first.
    pub channels: &'a [Arc<dyn Channel>],
    /// The protocol version this server speaks.
    pub version: u16,
    /// The limits this server announces.
    pub limits: Limits,
    /// The bearer token a client must present.
    pub require_token: Option<&'a str>,
}

/// A refusal, with the HELLO it answers when that parsed.
pub type Refused = (Refusal, Option<Box<Hello>>);

/// The server's whole decision on a HELLO frame: `hello` is the parsed frame, or why it did
/// not parse; `preamble_version` is the version the client's preamble announced. In order:
/// an unparsable HELLO is [`Refusal::Malformed`]; a HELLO whose version is not its
/// preamble's is `Malformed`; a missing or wrong token (compared in constant time) is
/// [`Refusal::BadToken`]; then [`server_choose`] (protocol name, version, channels).
/// The HELLO comes back with the decision: with the WELCOME, and with a refusal when it
/// parsed (for the caller's logs and the client's limits).
pub fn server_decide(
    policy: &ServerPolicy<'_>,
    preamble_version: u16,
    hello: Result<Hello, String>,
    conn: &ConnInfo,
) -> Result<(Welcome, Hello), Refused> {
    let hello = hello.map_err(|detail| (Refusal::Malformed { detail }, None))?;
    let decision = if hello.version != preamble_version {
        Err(Refusal::Malformed {
            detail: format!("preamble says version {preamble_version}, HELLO says {}", hello.version),
        })
    } else if let Some(want) = policy.require_token
        && !hello.token.as_deref().is_some_and(|t| constant_time_eq(t.as_bytes(), want.as_bytes()))
    {
        Err(Refusal::BadToken)
    } else {
        server_choose(policy.channels, &hello, conn, policy.version, policy.limits)
    };
    match decision {
        Ok(welcome) => Ok((welcome, hello)),
        Err(refusal) => Err((refusal, Some(Box::new(hello)))),
    }
}

/// A device kind and the channel that carries its tensors.
pub type Chosen<'c> = (DeviceKind, &'c Arc<dyn Channel>);

/// The client's checks of the server's WELCOME against its own HELLO: the version is the
/// one the client speaks, cpu tensors have a channel, and every channel chosen is one the
/// client offered for that device kind and has. Returns the channel to open for each
/// device kind the WELCOME names.
pub fn client_accept<'c>(
    channels: &'c [Arc<dyn Channel>],
    hello: &Hello,
    welcome: &Welcome,
) -> Result<Vec<Chosen<'c>>, ProtocolError> {
    if welcome.version != hello.version {
        return Err(ProtocolError::BadHeader(format!(
            "server welcomed protocol version {}, this client speaks {}",
            welcome.version, hello.version
        )));
    }
    if !welcome.channels.contains_key(&DeviceKind::Cpu) {
        return Err(ProtocolError::BadHeader("server chose no channel for cpu tensors".into()));
    }
    let mut open = Vec::with_capacity(welcome.channels.len());
    for (kind, name) in &welcome.channels {
        let offered = hello.channels.iter().any(|o| &o.name == name && o.devices.contains(kind));
        let Some(c) = channels.iter().find(|c| c.name() == name && c.devices().contains(kind)).filter(|_| offered)
        else {
            return Err(ProtocolError::BadHeader(format!(
                "server chose channel {name:?} for {kind:?} tensors, which this client did not offer"
            )));
        };
        open.push((*kind, c));
    }
    Ok(open)
}

/// Compares two secrets (bearer tokens) in time that does not depend on where they differ
/// (the length is not secret).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inline::InlineChannel;

    /// (case, preamble version, HELLO or why it did not parse, token required, server
    /// version, the WELCOME's cpu channel or a text of the refusal)
    type ServerRow =
        (&'static str, u16, Result<Hello, String>, Option<&'static str>, u16, Result<&'static str, &'static str>);
    /// (case, WELCOME, the device kinds to open or a text of the error)
    type ClientRow = (&'static str, Welcome, Result<Vec<DeviceKind>, &'static str>);

    fn inline() -> Vec<Arc<dyn Channel>> {
        vec![Arc::new(InlineChannel)]
    }

    fn hello() -> Hello {
        client_hello(&inline(), &ConnInfo::default(), 1, None, Limits::default())
    }

    #[test]
    fn negotiation() {
        let chans = inline();
        let conn = ConnInfo::default();
        let w = server_choose(&chans, &hello(), &conn, 1, Limits::default()).unwrap();
        assert_eq!(w.channels[&DeviceKind::Cpu], "inline");
        assert!(!w.channels.contains_key(&DeviceKind::Cuda));
        let none = Hello { channels: vec![], ..hello() };
        let r = server_choose(&chans, &none, &conn, 1, Limits::default()).unwrap_err();
        assert!(r.to_string().contains("server supports [inline]"), "{r}");
    }

    /// The server's decision, one row per rule, in the order the rules apply.
    #[test]
    fn server_decisions() {
        let chans = inline();
        let with = |f: fn(&mut Hello)| {
            let mut h = hello();
            f(&mut h);
            h
        };
        let rows: Vec<ServerRow> = vec![
            ("accepted", 1, Ok(hello()), None, 1, Ok("inline")),
            ("a token nobody asked for is ignored", 1, Ok(with(|h| h.token = Some("t".into()))), None, 1, Ok("inline")),
            (
                "HELLO did not parse",
                1,
                Err("expected value at line 1".into()),
                None,
                1,
                Err("malformed hello: expected value"),
            ),
            ("preamble and HELLO disagree", 2, Ok(hello()), None, 1, Err("preamble says version 2, HELLO says 1")),
            ("token missing", 1, Ok(hello()), Some("secret"), 1, Err("missing or wrong bearer token")),
            ("token wrong", 1, Ok(with(|h| h.token = Some("secreT".into()))), Some("secret"), 1, Err("bearer token")),
            ("token a prefix", 1, Ok(with(|h| h.token = Some("secre".into()))), Some("secret"), 1, Err("bearer token")),
            ("token right", 1, Ok(with(|h| h.token = Some("secret".into()))), Some("secret"), 1, Ok("inline")),
            ("the token is checked before the version", 1, Ok(hello()), Some("secret"), 2, Err("bearer token")),
            ("versions differ", 1, Ok(hello()), None, 2, Err("server speaks 2, client speaks 1")),
            ("another protocol", 1, Ok(with(|h| h.protocol = "http".into())), None, 1, Err("protocol is \"http\"")),
            ("nothing offered", 1, Ok(with(|h| h.channels.clear())), None, 1, Err("no common channel for cpu tensors")),
            (
                "only unknown channels offered",
                1,
                Ok(with(|h| h.channels[0].name = "rdma".into())),
                None,
                1,
                Err("client offered [rdma]"),
            ),
        ];
        for (case, preamble, hello, token, version, want) in rows {
            let policy = ServerPolicy { channels: &chans, version, limits: Limits::default(), require_token: token };
            let parsed = hello.is_ok();
            let got = server_decide(&policy, preamble, hello, &ConnInfo::default());
            assert!(
                got.as_ref().map_or_else(|(_, h)| h.is_some() == parsed, |_| parsed),
                "{case}: the HELLO comes back"
            );
            match (got.map(|(w, _)| w).map_err(|(r, _)| r), want) {
                (Ok(w), Ok(channel)) => {
                    assert_eq!(w.channels[&DeviceKind::Cpu], channel, "{case}");
                    assert_eq!(w.version, version, "{case}");
                }
                (Err(r), Err(text)) => assert!(r.to_string().contains(text), "{case}: {r}"),
                (got, want) => panic!("{case}: got {got:?}, want {want:?}"),
            }
        }
    }

    /// The client's checks of a WELCOME, one row per rule.
    #[test]
    fn client_checks() {
        let chans = inline();
        let h = hello();
        let ok = server_choose(&chans, &h, &ConnInfo::default(), 1, Limits::default()).unwrap();
        let with = |f: &dyn Fn(&mut Welcome)| {
            let mut w = ok.clone();
            f(&mut w);
            w
        };
        let rows: Vec<ClientRow> = vec![
            ("accepted", ok.clone(), Ok(vec![DeviceKind::Cpu])),
            (
                "another version",
                with(&|w| w.version = 2),
                Err("server welcomed protocol version 2, this client speaks 1"),
            ),
            ("no cpu channel", with(&|w| w.channels.clear()), Err("no channel for cpu tensors")),
            (
                "a channel not offered",
                with(&|w| {
                    w.channels.insert(DeviceKind::Cpu, "shm".into());
                }),
                Err("chose channel \"shm\" for Cpu tensors, which this client did not offer"),
            ),
            (
                "an offered channel for a device kind it does not carry",
                with(&|w| {
                    w.channels.insert(DeviceKind::Cuda, "inline".into());
                }),
                Err("for Cuda tensors, which this client did not offer"),
            ),
        ];
        for (case, welcome, want) in rows {
            match (client_accept(&chans, &h, &welcome), want) {
                (Ok(open), Ok(kinds)) => {
                    assert_eq!(open.iter().map(|(k, _)| *k).collect::<Vec<_>>(), kinds, "{case}");
                    assert!(open.iter().all(|(_, c)| c.name() == "inline"), "{case}");
                }
                (Err(e), Err(text)) => assert!(e.to_string().contains(text), "{case}: {e}"),
                (got, want) => panic!("{case}: got {:?}, want {want:?}", got.map(|v| v.len())),
            }
        }
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
    }
}
