//! The plumbing every in-test server shares: a listener on 127.0.0.1, a
//! thread of its own with a single-threaded tokio runtime (so servers work
//! the same from plain `#[test]`s and from `#[tokio::test]`s, paused clock
//! included), stop and join on drop; gRPC (tonic) and HTTP/1.1 (hyper)
//! serving, over TLS when given [`ServerTls`], and request bodies read with
//! a size limit and `Content-Encoding: gzip` undone.

use std::convert::Infallible;
use std::io::Read;
use std::net::{SocketAddr, TcpListener as StdTcpListener};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{HeaderMap, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::sync::oneshot;
use tonic::transport::server::TcpIncoming;

/// A server's TLS material (PEM).
#[derive(Clone, Debug)]
pub struct ServerTls {
    pub cert_pem: String,
    pub key_pem: String,
    /// Client certificates must chain to this CA (mutual TLS) if given.
    pub client_ca_pem: Option<String>,
}

impl ServerTls {
    /// `leaf` as the server's certificate, requiring client certificates
    /// from `client_ca` if given.
    pub fn new(leaf: &crate::pki::Leaf, client_ca: Option<&crate::pki::Ca>) -> ServerTls {
        ServerTls {
            cert_pem: leaf.cert_pem.clone(),
            key_pem: leaf.key_pem.clone(),
            client_ca_pem: client_ca.map(|ca| ca.pem.clone()),
        }
    }
}

/// A tonic server builder, over TLS with `tls` if given.
fn grpc_builder(tls: Option<&ServerTls>) -> tonic::transport::Server {
    use tonic::transport::{Certificate, Identity, ServerTlsConfig};
    let builder = tonic::transport::Server::builder();
    let Some(tls) = tls else {
        return builder;
    };
    let mut config =
        ServerTlsConfig::new().identity(Identity::from_pem(&tls.cert_pem, &tls.key_pem));
    if let Some(ca) = &tls.client_ca_pem {
        config = config.client_ca_root(Certificate::from_pem(ca));
    }
    builder
        .tls_config(config)
        .unwrap_or_else(|e| panic!("gRPC server TLS: {e}"))
}

/// The server thread of a receiver: stops (abruptly, dropping open
/// connections) and is joined on drop.
struct ServerThread {
    shutdown: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<()>>,
}

impl ServerThread {
    fn spawn<F, Fut>(name: &str, listener: StdTcpListener, serve: F) -> ServerThread
    where
        F: FnOnce(tokio::net::TcpListener) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()>,
    {
        let (tx, rx) = oneshot::channel::<()>();
        let thread_name = name.to_string();
        let handle = std::thread::Builder::new()
            .name(thread_name.clone())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        eprintln!("{thread_name}: cannot build tokio runtime: {e}");
                        return;
                    }
                };
                rt.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => {
                            eprintln!("{thread_name}: cannot register listener: {e}");
                            return;
                        }
                    };
                    tokio::select! {
                        _ = serve(listener) => {}
                        _ = rx => {}
                    }
                });
                // Dropping the runtime cancels the connection tasks.
            })
            .unwrap_or_else(|e| panic!("spawn {name} thread: {e}"));
        ServerThread {
            shutdown: Some(tx),
            handle: Some(handle),
        }
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(handle) = self.handle.take() {
            // Bounded: the server future is dropped as soon as the signal
            // arrives, and runtime shutdown only cancels tasks.
            let _ = handle.join();
        }
    }
}

/// A server on 127.0.0.1 in a thread of its own ([`ServerThread`]): where
/// it listens and whether over TLS; stops on drop.
pub(crate) struct Listening {
    addr: SocketAddr,
    tls: bool,
    _thread: ServerThread,
}

impl Listening {
    /// Serves gRPC on 127.0.0.1:`port` (0: OS-chosen), over TLS with `tls`
    /// if given: `serve` runs a tonic server made from the builder it gets
    /// on the incoming connections.
    pub(crate) fn grpc<F, Fut>(
        name: &'static str,
        port: u16,
        tls: Option<&ServerTls>,
        serve: F,
    ) -> Listening
    where
        F: FnOnce(tonic::transport::Server, TcpIncoming) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<(), tonic::transport::Error>>,
    {
        let listener = bind(port);
        let addr = local_addr(&listener);
        let builder = grpc_builder(tls);
        let thread = serve_grpc(name, listener, move |incoming| serve(builder, incoming));
        Listening {
            addr,
            tls: tls.is_some(),
            _thread: thread,
        }
    }

    /// Serves HTTP/1.1 on 127.0.0.1:`port` (0: OS-chosen), over TLS with
    /// `tls` if given, answering each request with `handle`.
    pub(crate) fn http<H, Fut>(
        name: &'static str,
        port: u16,
        tls: Option<&ServerTls>,
        handle: H,
    ) -> Listening
    where
        H: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<Response<Full<Bytes>>, Infallible>>
            + Send
            + 'static,
    {
        let listener = bind(port);
        let addr = local_addr(&listener);
        let thread = serve_http1(name, listener, tls.map(tls_acceptor), handle);
        Listening {
            addr,
            tls: tls.is_some(),
            _thread: thread,
        }
    }

    /// The listening address.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, `https://` over TLS.
    pub(crate) fn endpoint(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }
}

/// Binds 127.0.0.1:`port` (0: OS-chosen). A chosen port that was just
/// released is retried for up to 2 s: a child process that a parallel test
/// forked while the old listener was open holds a copy of it until its exec
/// closes it (the socket is close-on-exec), and binding in that window fails
/// with "address in use".
fn bind(port: u16) -> StdTcpListener {
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    let listener = loop {
        match StdTcpListener::bind(("127.0.0.1", port)) {
            Err(e)
                if port != 0
                    && e.kind() == std::io::ErrorKind::AddrInUse
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            bound => break bound,
        }
    }
    .unwrap_or_else(|e| panic!("bind 127.0.0.1:{port}: {e}"));
    listener
        .set_nonblocking(true)
        .unwrap_or_else(|e| panic!("set_nonblocking: {e}"));
    listener
}

fn local_addr(listener: &StdTcpListener) -> SocketAddr {
    listener
        .local_addr()
        .unwrap_or_else(|e| panic!("local_addr: {e}"))
}

/// Serves gRPC on `listener` from a thread of its own: `serve` runs the
/// tonic server on the incoming connections, with `TCP_NODELAY` as real
/// OTLP receivers set it (a response must not wait for the client's
/// delayed acknowledgement of the previous write).
fn serve_grpc<F, Fut>(name: &'static str, listener: StdTcpListener, serve: F) -> ServerThread
where
    F: FnOnce(TcpIncoming) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<(), tonic::transport::Error>>,
{
    ServerThread::spawn(name, listener, move |listener| async move {
        if let Err(e) = serve(TcpIncoming::from(listener).with_nodelay(Some(true))).await {
            eprintln!("{name}: {e}");
        }
    })
}

/// Serves HTTP/1.1 on `listener` from a thread of its own, answering each
/// request with `handle`; over TLS when `tls` is given.
fn serve_http1<H, Fut>(
    name: &'static str,
    listener: StdTcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    handle: H,
) -> ServerThread
where
    H: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send + 'static,
{
    ServerThread::spawn(name, listener, move |listener| async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    eprintln!("{name}: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let handle = handle.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                let served = match tls {
                    None => serve_connection(stream, handle).await,
                    Some(acceptor) => match acceptor.accept(stream).await {
                        Ok(stream) => serve_connection(stream, handle).await,
                        Err(e) => {
                            eprintln!("{name}: TLS handshake: {e}");
                            return;
                        }
                    },
                };
                if let Err(e) = served
                    && !e.is_incomplete_message()
                {
                    eprintln!("{name}: connection: {e}");
                }
            });
        }
    })
}

async fn serve_connection<S, H, Fut>(stream: S, handle: H) -> Result<(), hyper::Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    H: Fn(Request<Incoming>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send + 'static,
{
    hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service_fn(handle))
        .await
}

/// A TLS acceptor for HTTP/1.1 with `tls`' certificate, requiring a client
/// certificate from its client CA if given.
fn tls_acceptor(tls: &ServerTls) -> tokio_rustls::TlsAcceptor {
    let (cert_pem, key_pem, client_ca_pem) =
        (&tls.cert_pem, &tls.key_pem, tls.client_ca_pem.as_deref());
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap_or_else(|e| panic!("TLS versions: {e}"));
    let builder = match client_ca_pem {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
                roots
                    .add(cert.unwrap_or_else(|e| panic!("client CA: {e}")))
                    .unwrap_or_else(|e| panic!("client CA: {e}"));
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .unwrap_or_else(|e| panic!("client verifier: {e}"));
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap_or_else(|e| panic!("server certificate: {e}"));
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .unwrap_or_else(|e| panic!("server key: {e}"));
    let mut config = builder
        .with_single_cert(chain, key)
        .unwrap_or_else(|e| panic!("server certificate and key: {e}"));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

pub(crate) fn http_response(
    status: StatusCode,
    content_type: &str,
    body: Vec<u8>,
) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response
            .headers_mut()
            .insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}

/// A `text/plain` error answer.
pub(crate) fn http_error(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    http_response(status, "text/plain", message.as_bytes().to_vec())
}

/// The headers and the body (see [`read_body`]) of a `POST path` request;
/// or the error answer to give, also to another path or method.
pub(crate) async fn read_post(
    req: Request<Incoming>,
    path: &str,
    max: usize,
) -> Result<(HeaderMap, Vec<u8>), Response<Full<Bytes>>> {
    if req.uri().path() != path {
        return Err(http_error(StatusCode::NOT_FOUND, &format!("only {path}")));
    }
    if req.method() != hyper::Method::POST {
        return Err(http_error(StatusCode::METHOD_NOT_ALLOWED, "POST only"));
    }
    read_body(req, max).await
}

/// The headers and the body of `req`, at most `max` bytes once a
/// `Content-Encoding: gzip` is undone; or the error answer to give.
pub(crate) async fn read_body(
    req: Request<Incoming>,
    max: usize,
) -> Result<(HeaderMap, Vec<u8>), Response<Full<Bytes>>> {
    let (parts, body) = req.into_parts();
    let body = match Limited::new(body, max).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => return Err(http_error(StatusCode::BAD_REQUEST, &format!("body: {e}"))),
    };
    let encoding = parts
        .headers
        .get(hyper::header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok());
    let body = match encoding.map(str::trim) {
        None | Some("") | Some("identity") => body.to_vec(),
        Some("gzip") => {
            let mut out = Vec::new();
            let decoder = flate2::read::GzDecoder::new(&body[..]);
            if let Err(e) = decoder.take(max as u64 + 1).read_to_end(&mut out) {
                return Err(http_error(StatusCode::BAD_REQUEST, &format!("gzip: {e}")));
            }
            if out.len() > max {
                return Err(http_error(StatusCode::PAYLOAD_TOO_LARGE, "too large"));
            }
            out
        }
        Some(other) => {
            return Err(http_error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                &format!("unsupported Content-Encoding {other}"),
            ));
        }
    };
    Ok((parts.headers, body))
}

/// The value of header `name`, if it is text.
pub(crate) fn header_text(
    headers: &HeaderMap,
    name: impl hyper::header::AsHeaderName,
) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(String::from)
}
