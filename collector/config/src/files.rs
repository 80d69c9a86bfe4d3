//! Bounded reading of the files the configuration names: the configuration
//! file itself, the bearer token file, the exporters' header files, and the
//! TLS certificates, keys and CAs.
//!
//! Every such file goes through [`read_limited`], which owns three rules:
//!
//! * the file is opened with `O_NONBLOCK`, so a FIFO with no writer cannot
//!   block the start (nor `validate`);
//! * the opened file (not the path, which could be swapped in between) must
//!   be a regular file: a directory, FIFO, socket or device (`/dev/zero`,
//!   `/dev/urandom`, a terminal) is refused;
//! * at most `limit` bytes are read, and a longer file is an error, so no
//!   file can make the collector allocate without bound before a port is
//!   bound.
//!
//! Errors name the configuration key and the path, never the content.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use crate::ConfigError;

/// Largest secret or PEM file (token, header value, certificate chain, key,
/// CA bundle): 1 MiB, far above any real one (a public CA bundle is about
/// 200 KiB).
pub const SECRET_FILE_LIMIT: u64 = 1024 * 1024;

/// Largest configuration file: 4 MiB (the documented example is 10 KiB).
pub const CONFIG_FILE_LIMIT: u64 = 4 * 1024 * 1024;

/// Reads the regular file at `path`, at most `limit` bytes. `key` is the
/// configuration key naming the file, for the error.
pub fn read_limited(key: &str, path: &Path, limit: u64) -> Result<Vec<u8>, ConfigError> {
    let shown = path.display();
    let file = open_nonblocking(path)
        .map_err(|e| ConfigError::new(key, format!("cannot read {shown}: {e}")))?;
    let metadata = file
        .metadata()
        .map_err(|e| ConfigError::new(key, format!("cannot read {shown}: {e}")))?;
    if !metadata.is_file() {
        return Err(ConfigError::new(
            key,
            format!(
                "{shown} is {}, not a regular file",
                describe(&metadata.file_type())
            ),
        ));
    }
    if metadata.len() > limit {
        return Err(too_large(key, path, limit));
    }
    let mut bytes = Vec::new();
    // One byte past the limit tells a file that grew since the fstat.
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| ConfigError::new(key, format!("cannot read {shown}: {e}")))?;
    if bytes.len() as u64 > limit {
        return Err(too_large(key, path, limit));
    }
    Ok(bytes)
}

/// As [`read_limited`], the content as UTF-8 text.
pub fn read_limited_text(key: &str, path: &Path, limit: u64) -> Result<String, ConfigError> {
    let bytes = read_limited(key, path, limit)?;
    String::from_utf8(bytes)
        .map_err(|_| ConfigError::new(key, format!("{} is not UTF-8 text", path.display())))
}

fn too_large(key: &str, path: &Path, limit: u64) -> ConfigError {
    ConfigError::new(
        key,
        format!(
            "{} is larger than the limit of {} KiB",
            path.display(),
            limit / 1024
        ),
    )
}

#[cfg(unix)]
fn open_nonblocking(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let nonblock = rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::NOCTTY;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nonblock.bits() as i32)
        .open(path)
}

#[cfg(not(unix))]
fn open_nonblocking(path: &Path) -> std::io::Result<File> {
    File::open(path)
}

/// "a directory", "a FIFO", … for an error message.
pub fn describe(file_type: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if file_type.is_fifo() {
            return "a FIFO";
        }
        if file_type.is_socket() {
            return "a socket";
        }
        if file_type.is_char_device() {
            return "a character device";
        }
        if file_type.is_block_device() {
            return "a block device";
        }
    }
    if file_type.is_dir() {
        "a directory"
    } else if file_type.is_symlink() {
        "a symbolic link"
    } else {
        "not a regular file"
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn reads_a_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "s3cret\n").unwrap();
        assert_eq!(read_limited("k", &path, 16).unwrap(), b"s3cret\n");
        assert_eq!(read_limited_text("k", &path, 7).unwrap(), "s3cret\n");
    }

    #[test]
    fn a_file_over_the_limit_is_refused_naming_key_and_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.pem");
        std::fs::write(&path, vec![b'a'; 4096]).unwrap();
        let e = read_limited("receiver.tls.cert_file", &path, 2048).unwrap_err();
        assert_eq!(e.path, "receiver.tls.cert_file");
        assert!(e.reason.contains("limit of 2 KiB"), "{e}");
    }

    #[test]
    fn devices_directories_and_fifos_are_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        let mut cases = vec![
            (Path::new("/dev/zero").to_owned(), "character device"),
            (Path::new("/dev/urandom").to_owned(), "character device"),
            (dir.path().to_owned(), "directory"),
        ];
        if made.is_ok_and(|s| s.success()) {
            cases.push((fifo, "FIFO"));
        }
        for (path, what) in cases {
            let start = Instant::now();
            let e = read_limited("receiver.auth.token_file", &path, SECRET_FILE_LIMIT).unwrap_err();
            assert!(start.elapsed() < Duration::from_secs(2), "{path:?}");
            assert_eq!(e.path, "receiver.auth.token_file");
            assert!(e.reason.contains(what), "{path:?}: {e}");
        }
    }

    #[test]
    fn a_missing_file_is_an_error_naming_the_key() {
        let e = read_limited("k.x", Path::new("/nonexistent/x"), 10).unwrap_err();
        assert_eq!(e.path, "k.x");
        assert!(e.reason.contains("cannot read"), "{e}");
    }
}
