//! Server certificates read from PEM files and re-read while serving: the admission webhook
//! and the agent service both take theirs from a Secret that helm or cert-manager rotates.
//!
//! The files are read again every `reload_every`; when their content changed the servers
//! switch to the new certificate for new connections. A change that does not parse is
//! logged and the previous certificate kept, so a half-written Secret never takes a server
//! down.

use std::path::{Path, PathBuf};
use std::time::Duration;

use axum_server::tls_rustls::RustlsConfig;
use tokio::task::JoinHandle;

/// How often certificate files are read for a rotation.
pub const RELOAD_EVERY: Duration = Duration::from_secs(10);

/// A certificate chain and key as files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertFiles {
    /// PEM certificate chain, the server's certificate first.
    pub cert_file: PathBuf,
    /// PEM private key.
    pub key_file: PathBuf,
}

/// A loaded certificate that follows its files.
#[derive(Clone)]
pub struct ReloadingCert {
    config: RustlsConfig,
}

impl std::fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReloadingCert")
    }
}

impl ReloadingCert {
    /// Loads `files` (HTTP/2 and HTTP/1.1 offered by ALPN) and keeps re-reading them every
    /// `every` in a task that lives as long as the returned handle is not aborted.
    pub async fn load(
        files: &CertFiles,
        what: &'static str,
        every: Duration,
    ) -> std::io::Result<(Self, JoinHandle<()>)> {
        let config = RustlsConfig::from_pem_file(&files.cert_file, &files.key_file).await?;
        let task = tokio::spawn(reload_loop(files.clone(), what, every, config.clone()));
        Ok((Self { config }, task))
    }

    /// The configuration for axum-server.
    pub fn rustls(&self) -> RustlsConfig {
        self.config.clone()
    }

    /// An acceptor with the certificate loaded now (take one per connection, so rotations
    /// reach new connections).
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.config.get_inner())
    }
}

async fn reload_loop(files: CertFiles, what: &'static str, every: Duration, tls: RustlsConfig) {
    let mut seen = read_pair(&files.cert_file, &files.key_file);
    let mut interval = tokio::time::interval(every);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let cert = files.cert_file.display().to_string();
    loop {
        interval.tick().await;
        let now = read_pair(&files.cert_file, &files.key_file);
        if now == seen {
            continue;
        }
        let Some((pem, key)) = now.clone() else {
            tracing::warn!(%cert, what, "the certificate files are unreadable; serving the previous certificate");
            seen = now;
            continue;
        };
        match tls.reload_from_pem(pem, key).await {
            Ok(()) => tracing::info!(%cert, what, "certificate reloaded"),
            Err(error) => {
                tracing::warn!(%error, %cert, what, "the changed certificate does not load; serving the previous certificate")
            }
        }
        seen = now;
    }
}

fn read_pair(cert: &Path, key: &Path) -> Option<(Vec<u8>, Vec<u8>)> {
    Some((std::fs::read(cert).ok()?, std::fs::read(key).ok()?))
}

/// How long a client may take over its TLS handshake before the connection is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The connections accepted on `listener`, each after its TLS handshake with the certificate
/// current at that moment. Handshakes run concurrently, so a slow or silent client holds up
/// no other; failed ones are logged at debug level and dropped. Accepting stops once the
/// returned stream is dropped.
pub fn incoming(
    listener: tokio::net::TcpListener,
    cert: ReloadingCert,
) -> tokio_stream::wrappers::ReceiverStream<
    std::io::Result<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>,
> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                () = tx.closed() => return,
            };
            let (tcp, peer) = match accepted {
                Ok(a) => a,
                Err(error) => {
                    // Out of file descriptors and the like: pause instead of spinning.
                    tracing::warn!(%error, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let (acceptor, tx) = (cert.acceptor(), tx.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(Ok(tls)).await;
                    }
                    Ok(Err(error)) => tracing::debug!(%peer, %error, "TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
