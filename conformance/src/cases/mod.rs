//! The cases. Every `pub fn` in these modules is listed in [`all`] (a tidy check enforces it).
//!
//! - [`data`]: messages and tensors survive the trip intact and in order (threads and
//!   processes).
//! - [`faults`]: a peer that dies (SIGKILL) is noticed within a second.
//! - [`malformed`]: hand-made bad frames give typed errors and a clean close.
//! - [`handshake`]: refusals and limits.

use crate::{Fixture, Outcome, Peers};

pub mod data;
pub mod faults;
pub mod handshake;
pub mod malformed;

/// A case ready to run against a fixture.
pub type Case<F> = Box<dyn Fn(&F) -> Outcome + Send + Sync>;

fn both<F: Fixture>(out: &mut Vec<(String, Case<F>)>, name: &str, f: fn(&F, Peers) -> Outcome) {
    for mode in [Peers::Threads, Peers::Processes] {
        if mode == Peers::Processes && !F::PROCESS_PEERS {
            continue;
        }
        out.push((format!("{name}::{}", mode.name()), Box::new(move |fx: &F| f(fx, mode))));
    }
}

fn one<F: Fixture>(out: &mut Vec<(String, Case<F>)>, name: &str, f: fn(&F) -> Outcome) {
    out.push((name.to_string(), Box::new(f)));
}

/// Every case, named `module::case` (data cases get `::threads` / `::processes`); without
/// the process cases for a fixture whose transport stays in one process
/// ([`Fixture::PROCESS_PEERS`]).
pub fn all<F: Fixture>() -> Vec<(String, Case<F>)> {
    let mut v = Vec::new();
    both(&mut v, "data::every_dtype", data::every_dtype::<F>);
    both(&mut v, "data::zero_d_and_empty", data::zero_d_and_empty::<F>);
    both(&mut v, "data::strided", data::strided::<F>);
    both(&mut v, "data::payload_sizes", data::payload_sizes::<F>);
    both(&mut v, "data::many_tensors", data::many_tensors::<F>);
    both(&mut v, "data::order_10k", data::order_10k::<F>);
    both(&mut v, "data::sixteen_pipes", data::sixteen_pipes::<F>);
    both(&mut v, "data::concurrent_senders", data::concurrent_senders::<F>);
    both(&mut v, "data::big_header", data::big_header::<F>);
    one(&mut v, "data::close_is_clean", data::close_is_clean::<F>);
    if F::PROCESS_PEERS {
        one(&mut v, "faults::peer_dies_mid_message", faults::peer_dies_mid_message::<F>);
        one(&mut v, "faults::client_dies_idle", faults::client_dies_idle::<F>);
        one(&mut v, "faults::server_dies_during_recv", faults::server_dies_during_recv::<F>);
    }
    one(&mut v, "malformed::unknown_kind", malformed::unknown_kind::<F>);
    one(&mut v, "malformed::reserved_flags", malformed::reserved_flags::<F>);
    one(&mut v, "malformed::header_not_json", malformed::header_not_json::<F>);
    one(&mut v, "malformed::header_over_limit", malformed::header_over_limit::<F>);
    one(&mut v, "malformed::payload_over_limit", malformed::payload_over_limit::<F>);
    one(&mut v, "malformed::too_many_fds", malformed::too_many_fds::<F>);
    one(&mut v, "malformed::fds_announced_not_sent", malformed::fds_announced_not_sent::<F>);
    one(&mut v, "malformed::range_outside_payload", malformed::range_outside_payload::<F>);
    one(&mut v, "malformed::length_lies", malformed::length_lies::<F>);
    one(&mut v, "malformed::shape_overflows", malformed::shape_overflows::<F>);
    one(&mut v, "malformed::negative_stride", malformed::negative_stride::<F>);
    one(&mut v, "malformed::too_many_dims", malformed::too_many_dims::<F>);
    one(&mut v, "malformed::too_many_tensors", malformed::too_many_tensors::<F>);
    one(&mut v, "malformed::unknown_dtype", malformed::unknown_dtype::<F>);
    one(&mut v, "malformed::compact_descriptor_short", malformed::compact_descriptor_short::<F>);
    one(&mut v, "malformed::compact_descriptors_are_read", malformed::compact_descriptors_are_read::<F>);
    one(&mut v, "malformed::truncated_frame", malformed::truncated_frame::<F>);
    one(&mut v, "malformed::second_hello", malformed::second_hello::<F>);
    one(&mut v, "malformed::bad_magic", malformed::bad_magic::<F>);
    one(&mut v, "malformed::jsonrpc_on_frame_socket", malformed::jsonrpc_on_frame_socket::<F>);
    one(&mut v, "handshake::negotiates_expected_channel", handshake::negotiates_expected_channel::<F>);
    one(&mut v, "handshake::version_mismatch", handshake::version_mismatch::<F>);
    one(&mut v, "handshake::no_common_channel", handshake::no_common_channel::<F>);
    one(&mut v, "handshake::bad_token", handshake::bad_token::<F>);
    one(&mut v, "handshake::send_over_peer_limit", handshake::send_over_peer_limit::<F>);
    one(&mut v, "handshake::silent_client_times_out", handshake::silent_client_times_out::<F>);
    one(&mut v, "handshake::server_respects_client_limits", handshake::server_respects_client_limits::<F>);
    one(&mut v, "handshake::unknown_offers_are_ignored", handshake::unknown_offers_are_ignored::<F>);
    one(&mut v, "handshake::foreign_json_is_handed_over", handshake::foreign_json_is_handed_over::<F>);
    one(&mut v, "handshake::hangup_during_handshake", handshake::hangup_during_handshake_is_not_listener_closed::<F>);
    v
}
