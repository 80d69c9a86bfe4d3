//! Where the ingest listens: a TCP address or a Unix domain socket.
//!
//! Owns: parsing `receiver.listen` ([`ListenAddr`]), binding it
//! ([`Listener::bind`], with a backlog of [`LISTEN_BACKLOG`]) and, for a
//! Unix socket, the socket file's life. What happens to accepted
//! connections is [`crate::conn`]'s.
//!
//! Invariants for a Unix socket:
//! - A stale socket file (nothing accepts on it) is removed before binding;
//!   a live one (another process accepts on it) or a path that exists and is
//!   not a socket is an error, never replaced.
//! - The socket file is created with mode `0600` (owner read/write: only the
//!   collector's user, and root, can connect): the process umask is `0177`
//!   while `bind` runs, and the mode is set again explicitly before the
//!   listener is returned, so no connection can be made through a wider mode.
//! - The file is removed when the [`Listener`] (or the server that owns it)
//!   is dropped, unless another file has replaced it at that path meanwhile.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use rustix::fs::Mode;
use tokio::net::{TcpListener, TcpSocket, UnixListener};

/// Prefix of a Unix domain socket address: `unix:/run/hermes/ingest.sock`.
pub const UNIX_PREFIX: &str = "unix:";

/// Mode of the socket file: read and write for the owner only.
pub const SOCKET_MODE: u32 = 0o600;

/// Backlog of the ingest listener: connections the kernel completes before
/// the collector accepts them (capped by `net.core.somaxconn`, 4096 by
/// default since Linux 5.4). std and tokio listen with 128; a fleet of shims
/// reconnecting at once (a collector restart, a rollout) overflows that, and
/// every connection attempt the kernel drops costs its shim a SYN
/// retransmission, one second later.
pub const LISTEN_BACKLOG: u32 = 4096;

/// Longest socket path the kernel accepts (`sun_path` is 108 bytes, one of
/// them the terminating NUL).
pub const MAX_SOCKET_PATH_BYTES: usize = 107;

/// A parsed `receiver.listen`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    /// `host:port`.
    Tcp(SocketAddr),
    /// `unix:/path/to/socket`.
    Unix(PathBuf),
}

/// Why a `receiver.listen` value is not an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenAddrError(String);

impl fmt::Display for ListenAddrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ListenAddrError {}

impl FromStr for ListenAddr {
    type Err = ListenAddrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(path) = s.strip_prefix(UNIX_PREFIX) {
            if path.is_empty() {
                return Err(ListenAddrError(format!(
                    "`{s}` names no socket path (unix:/path/to/socket)"
                )));
            }
            if path.len() > MAX_SOCKET_PATH_BYTES {
                return Err(ListenAddrError(format!(
                    "the socket path of `{s}` is {} bytes, longer than the {MAX_SOCKET_PATH_BYTES} a Unix socket allows",
                    path.len()
                )));
            }
            return Ok(ListenAddr::Unix(PathBuf::from(path)));
        }
        s.parse::<SocketAddr>().map(ListenAddr::Tcp).map_err(|e| {
            ListenAddrError(format!("`{s}` is neither host:port nor unix:/path ({e})"))
        })
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddr::Tcp(addr) => write!(f, "{addr}"),
            ListenAddr::Unix(path) => write!(f, "{UNIX_PREFIX}{}", path.display()),
        }
    }
}

/// A bound ingest listener.
#[derive(Debug)]
pub enum Listener {
    /// A TCP listener.
    Tcp(TcpListener),
    /// A Unix socket listener and its socket file (removed on drop).
    Unix(UnixListener, SocketFile),
}

impl Listener {
    /// Binds `addr`. Must run inside a tokio runtime.
    pub async fn bind(addr: &ListenAddr) -> io::Result<Listener> {
        match addr {
            ListenAddr::Tcp(addr) => Ok(Listener::Tcp(bind_tcp(*addr)?)),
            ListenAddr::Unix(path) => {
                let (listener, file) = bind_unix(path)?;
                Ok(Listener::Unix(listener, file))
            }
        }
    }

    /// The bound address (with the actual port when port 0 was asked for).
    pub fn local_addr(&self) -> io::Result<ListenAddr> {
        match self {
            Listener::Tcp(listener) => listener.local_addr().map(ListenAddr::Tcp),
            Listener::Unix(_, file) => Ok(ListenAddr::Unix(file.path.clone())),
        }
    }
}

/// The socket file of a bound Unix listener; removes it on drop if it is
/// still the same file.
#[derive(Debug)]
pub struct SocketFile {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl SocketFile {
    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|m| m.dev() == self.dev && m.ino() == self.ino);
        if ours && let Err(e) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot remove the ingest socket");
        }
    }
}

/// Removes a stale socket at `path`; refuses a live socket or another kind
/// of file.
fn clear_stale_socket(path: &Path) -> io::Result<()> {
    let metadata = match std::fs::symlink_metadata(path) {
        Ok(metadata) => metadata,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !metadata.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "{} exists and is not a socket; refusing to replace it",
                path.display()
            ),
        ));
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!("another process accepts connections on {}", path.display()),
        )),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            tracing::info!(path = %path.display(), "removing a stale ingest socket");
            std::fs::remove_file(path)
        }
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("cannot check the existing socket {}: {e}", path.display()),
        )),
    }
}

/// Binds a TCP listener as `TcpListener::bind` does (with `SO_REUSEADDR`),
/// with a backlog of [`LISTEN_BACKLOG`].
fn bind_tcp(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

fn bind_unix(path: &Path) -> io::Result<(UnixListener, SocketFile)> {
    clear_stale_socket(path)?;
    // The umask is process-wide: it is narrowed only around the bind, which
    // runs at startup before the pipeline's tasks create files.
    let previous = rustix::process::umask(Mode::from_raw_mode(0o177));
    let bound = UnixListener::bind(path);
    rustix::process::umask(previous);
    let listener = bound?;
    // Listening again on a listening socket sets its backlog (Linux).
    rustix::net::listen(&listener, i32::try_from(LISTEN_BACKLOG).unwrap_or(i32::MAX))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE))?;
    let metadata = std::fs::symlink_metadata(path)?;
    Ok((
        listener,
        SocketFile {
            path: path.to_owned(),
            dev: metadata.dev(),
            ino: metadata.ino(),
        },
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn parses_tcp_and_unix_addresses() {
        assert_eq!(
            "127.0.0.1:4319".parse::<ListenAddr>().unwrap(),
            ListenAddr::Tcp(([127, 0, 0, 1], 4319).into())
        );
        assert_eq!(
            "unix:/run/h.sock".parse::<ListenAddr>().unwrap(),
            ListenAddr::Unix("/run/h.sock".into())
        );
        assert_eq!(
            "unix:/run/h.sock"
                .parse::<ListenAddr>()
                .unwrap()
                .to_string(),
            "unix:/run/h.sock"
        );
        assert!("unix:".parse::<ListenAddr>().is_err());
        assert!("nowhere".parse::<ListenAddr>().is_err());
        let long = format!("unix:/{}", "x".repeat(200));
        assert!(
            long.parse::<ListenAddr>()
                .unwrap_err()
                .to_string()
                .contains("longer")
        );
    }

    #[tokio::test]
    async fn unix_socket_is_private_replaces_stale_and_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ingest.sock");
        let addr = ListenAddr::Unix(path.clone());

        let listener = Listener::bind(&addr).await.unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{mode:o}");
        assert_eq!(listener.local_addr().unwrap(), addr);

        // A live socket is not replaced.
        let err = Listener::bind(&addr).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse, "{err}");
        drop(listener);
        assert!(!path.exists(), "removed on drop");

        // A stale socket (its listener gone, its file left) is replaced.
        let stale = std::os::unix::net::UnixListener::bind(&path).unwrap();
        drop(stale);
        assert!(path.exists());
        let listener = Listener::bind(&addr).await.unwrap();
        drop(listener);

        // Anything else is refused and left alone.
        std::fs::write(&path, b"data").unwrap();
        let err = Listener::bind(&addr).await.unwrap_err();
        assert!(err.to_string().contains("not a socket"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"data");
    }

    /// More connections than std's and tokio's backlog of 128, as a fleet of
    /// shims reconnecting after a collector restart makes.
    const FLEET: usize = 300;

    /// Whether `net.core.somaxconn`, which caps every listener's backlog,
    /// leaves room for [`FLEET`] (says so when it does not).
    fn room_for_the_fleet() -> bool {
        let somaxconn: usize = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        if somaxconn <= FLEET {
            eprintln!("skipped: net.core.somaxconn is {somaxconn}, not above {FLEET}");
        }
        somaxconn > FLEET
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fleet_connecting_at_once_fits_the_tcp_accept_queue() {
        if !room_for_the_fleet() {
            return;
        }
        let listener = Listener::bind(&"127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let Ok(ListenAddr::Tcp(addr)) = listener.local_addr() else {
            panic!("not a TCP listener");
        };
        // Nobody accepts: a connection completes only while the accept queue
        // has room; past it the kernel drops the attempt and every
        // retransmission of it (1 s, 3 s, ... later) while the queue stays
        // full, so the bound below is generous, not a speed target.
        let mut connects = tokio::task::JoinSet::new();
        for _ in 0..FLEET {
            connects.spawn(async move {
                tokio::time::timeout(
                    std::time::Duration::from_secs(5),
                    tokio::net::TcpStream::connect(addr),
                )
                .await
            });
        }
        let mut connected = Vec::new();
        while let Some(done) = connects.join_next().await {
            if let Ok(Ok(stream)) = done.unwrap() {
                connected.push(stream);
            }
        }
        assert_eq!(connected.len(), FLEET);
    }

    #[tokio::test]
    async fn a_fleet_connecting_at_once_fits_the_unix_accept_queue() {
        if !room_for_the_fleet() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ingest.sock");
        let _listener = Listener::bind(&ListenAddr::Unix(path.clone()))
            .await
            .unwrap();
        // Nobody accepts: past the backlog a connect fails at once.
        let mut connected = Vec::new();
        for i in 0..FLEET {
            match tokio::net::UnixStream::connect(&path).await {
                Ok(stream) => connected.push(stream),
                Err(e) => panic!("connection {i} of {FLEET}: {e}"),
            }
        }
    }
}
