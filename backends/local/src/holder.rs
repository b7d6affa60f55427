//! Who holds a local socket address that is in use: a stale socket file, or a live
//! listener named by its peer credentials (unix).

/// Who holds a local socket address that is in use.
pub(crate) enum Holder {
    /// A socket file with no listener behind it (connecting is refused).
    Stale(std::path::PathBuf),
    /// A live listener, by its peer credentials.
    Live {
        /// Its process id, where the OS says.
        pid: Option<u32>,
        /// Its user id.
        uid: u32,
    },
    /// Could not tell (no permission to connect, an abstract name whose holder does not
    /// accept, ...).
    Unknown,
}

/// Finds out who holds `name` by connecting to it once (the connection is closed at once).
pub(crate) fn holder(name: &crate::SocketName) -> Holder {
    let stream = match name {
        crate::SocketName::Path(p) => match std::os::unix::net::UnixStream::connect(p) {
            Ok(s) => s,
            // Only a socket file is ever removed (connecting to a plain file is refused too).
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused && is_socket(p) => {
                return Holder::Stale(p.into());
            }
            Err(_) => return Holder::Unknown,
        },
        #[cfg(any(target_os = "linux", target_os = "android"))]
        crate::SocketName::Namespaced(n) => {
            use std::os::linux::net::SocketAddrExt;
            let Ok(sa) = std::os::unix::net::SocketAddr::from_abstract_name(n.as_bytes()) else {
                return Holder::Unknown;
            };
            match std::os::unix::net::UnixStream::connect_addr(&sa) {
                Ok(s) => s,
                Err(_) => return Holder::Unknown,
            }
        }
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        crate::SocketName::Namespaced(_) => return Holder::Unknown,
    };
    match rustix::net::sockopt::socket_peercred(&stream) {
        Ok(c) => Holder::Live { pid: u32::try_from(c.pid.as_raw_nonzero().get()).ok(), uid: c.uid.as_raw() },
        Err(_) => Holder::Unknown,
    }
}

fn is_socket(path: &str) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
}
