//! Dispatch without sockets: a `Conn` with no pipe, fed JSON values.
