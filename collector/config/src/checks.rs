//! Checks of the configuration that span keys or look at the file system,
//! so that `validate` refuses what the start would refuse: the log filter,
//! the span file, and the two listen addresses.
//!
//! Each check returns the reason only; the caller names the key.

use std::net::SocketAddr;
use std::path::Path;

use tracing_subscriber::filter::LevelFilter;

/// Checks a log filter (`log.level`, `RUST_LOG`) with the syntax the
/// collector's logging uses (`tracing_subscriber`'s `EnvFilter`), and more
/// strictly: a directive without `=` must be a level. `EnvFilter` takes a
/// bare word as a target enabled at every level, so a misspelt level
/// (`inof`) would silence every other log line without an error.
pub fn log_filter(filter: &str) -> Result<(), String> {
    if filter.trim().is_empty() {
        return Err("must not be empty".to_owned());
    }
    tracing_subscriber::EnvFilter::try_new(filter).map_err(|e| format!("`{filter}`: {e}"))?;
    for directive in filter.split(',').map(str::trim) {
        if directive.is_empty() || directive.contains('=') || directive.contains('[') {
            continue;
        }
        if directive.parse::<LevelFilter>().is_err() {
            return Err(format!(
                "`{directive}` is not a level (error, warn, info, debug, trace, off); \
                 a filter for one target is written `target=level`"
            ));
        }
    }
    Ok(())
}

/// Whether two TCP listeners would fight over one port: the same port
/// (not 0, which the system picks) on the same address, or on an
/// unspecified address (`0.0.0.0` covers every IPv4 address; `[::]` every
/// address of both families, as Linux binds it by default).
pub fn listens_clash(a: SocketAddr, b: SocketAddr) -> bool {
    if a.port() == 0 || a.port() != b.port() {
        return false;
    }
    let covers = |x: SocketAddr, y: SocketAddr| {
        x.ip().is_unspecified() && (x.is_ipv6() || x.is_ipv4() == y.is_ipv4())
    };
    a.ip() == b.ip() || covers(a, b) || covers(b, a)
}

/// Checks a directory the collector writes files into: it exists, is a
/// directory and can be written. It is not created: a mistyped path is an
/// error, not a new directory tree.
pub fn writable_dir(path: &Path) -> Result<(), String> {
    if path.as_os_str().is_empty() {
        return Err("must not be empty".to_owned());
    }
    let shown = path.display();
    match std::fs::metadata(path) {
        Ok(metadata) if metadata.is_dir() => {
            writable(path).map_err(|e| format!("{shown} cannot be written: {e}"))
        }
        Ok(_) => Err(format!("{shown} is not a directory")),
        Err(_) => Err(format!(
            "the directory {shown} does not exist (it is not created)"
        )),
    }
}

/// Checks the span file's path: an existing regular file or character
/// device (`/dev/null`) that can be written, or a new file in an existing,
/// writable directory. Parent directories are not created: a mistyped
/// path is an error, not a new directory tree.
pub fn span_file(path: &Path) -> Result<(), String> {
    if path.as_os_str().is_empty() {
        return Err("must not be empty".to_owned());
    }
    let shown = path.display();
    match std::fs::metadata(path) {
        Ok(metadata) => {
            let file_type = metadata.file_type();
            if !(metadata.is_file() || is_char_device(&file_type)) {
                return Err(format!(
                    "{shown} is {}; give the path of a file",
                    crate::files::describe(&file_type)
                ));
            }
            writable(path).map_err(|e| format!("{shown} cannot be written: {e}"))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let dir = match path.parent() {
                Some(dir) if !dir.as_os_str().is_empty() => dir,
                _ => Path::new("."),
            };
            match std::fs::metadata(dir) {
                Ok(metadata) if metadata.is_dir() => writable(dir)
                    .map_err(|e| format!("the file cannot be created in {}: {e}", dir.display())),
                Ok(_) => Err(format!("{} is not a directory", dir.display())),
                Err(_) => Err(format!(
                    "the directory {} does not exist (it is not created)",
                    dir.display()
                )),
            }
        }
        Err(e) => Err(format!("cannot use {shown}: {e}")),
    }
}

#[cfg(unix)]
fn is_char_device(file_type: &std::fs::FileType) -> bool {
    std::os::unix::fs::FileTypeExt::is_char_device(file_type)
}

#[cfg(not(unix))]
fn is_char_device(_: &std::fs::FileType) -> bool {
    false
}

#[cfg(unix)]
fn writable(path: &Path) -> std::io::Result<()> {
    use rustix::fs::{Access, access};
    let mode = if path.is_dir() {
        Access::WRITE_OK | Access::EXEC_OK
    } else {
        Access::WRITE_OK
    };
    access(path, mode).map_err(std::io::Error::from)
}

#[cfg(not(unix))]
fn writable(path: &Path) -> std::io::Result<()> {
    match std::fs::metadata(path)?.permissions().readonly() {
        true => Err(std::io::ErrorKind::PermissionDenied.into()),
        false => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn log_filters() {
        for ok in [
            "info",
            "WARN",
            "debug,hermes_collector=trace",
            "off",
            "hermes_exporter=debug",
            "info,h2=warn",
        ] {
            log_filter(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in [
            "inof",
            "",
            " ",
            "info,hermes_collector",
            "x=inof",
            "warn,deubg",
        ] {
            assert!(log_filter(bad).is_err(), "{bad:?} passes");
        }
        assert!(log_filter("inof").unwrap_err().contains("`inof`"));
    }

    #[test]
    fn clashing_listens() {
        let addr = |s: &str| s.parse::<SocketAddr>().unwrap();
        for (a, b) in [
            ("127.0.0.1:4319", "127.0.0.1:4319"),
            ("0.0.0.0:4319", "127.0.0.1:4319"),
            ("127.0.0.1:4319", "0.0.0.0:4319"),
            ("[::]:4319", "127.0.0.1:4319"),
            ("[::1]:4319", "[::]:4319"),
        ] {
            assert!(listens_clash(addr(a), addr(b)), "{a} {b}");
        }
        for (a, b) in [
            ("127.0.0.1:4319", "127.0.0.1:13133"),
            ("127.0.0.1:0", "127.0.0.1:0"),
            ("127.0.0.1:4319", "127.0.0.2:4319"),
            ("0.0.0.0:4319", "[::1]:4319"),
        ] {
            assert!(!listens_clash(addr(a), addr(b)), "{a} {b}");
        }
    }

    #[test]
    fn writable_dirs() {
        let dir = tempfile::tempdir().unwrap();
        writable_dir(dir.path()).unwrap();
        let e = writable_dir(&dir.path().join("missing")).unwrap_err();
        assert!(e.contains("does not exist"), "{e}");
        let file = dir.path().join("f");
        std::fs::write(&file, b"").unwrap();
        let e = writable_dir(&file).unwrap_err();
        assert!(e.contains("not a directory"), "{e}");
        assert!(writable_dir(Path::new("")).is_err());
    }

    #[test]
    fn span_file_paths() {
        let dir = tempfile::tempdir().unwrap();
        span_file(&dir.path().join("spans.jsonl")).unwrap();
        span_file(Path::new("/dev/null")).unwrap();
        let e = span_file(dir.path()).unwrap_err();
        assert!(e.contains("is a directory"), "{e}");
        let e = span_file(&dir.path().join("missing/spans.jsonl")).unwrap_err();
        assert!(e.contains("does not exist"), "{e}");
        assert!(!dir.path().join("missing").exists(), "never created");
        let file = dir.path().join("file");
        std::fs::write(&file, "").unwrap();
        let e = span_file(&file.join("spans.jsonl")).unwrap_err();
        assert!(e.to_lowercase().contains("not a directory"), "{e}");
        assert!(span_file(Path::new("")).is_err());
    }
}
