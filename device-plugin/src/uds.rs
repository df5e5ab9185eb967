//! gRPC over Unix sockets: a client channel to a socket path and a listener that
//! replaces a stale socket file.

use std::io;
use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tonic::transport::{Channel, Endpoint, Uri};

/// Opens a gRPC channel to the Unix socket at `path`.
///
/// The connection is made eagerly, so an absent socket fails here rather than on the
/// first call; tonic reconnects to the same path if the connection later drops.
pub async fn connect(path: impl Into<PathBuf>) -> Result<Channel, tonic::transport::Error> {
    let path = path.into();
    // The authority is required by the URI type but never resolved: the connector
    // below ignores it and dials the socket path.
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
}

/// Binds a listener at `path`, first removing whatever socket a previous run left
/// there (a bind on an existing path fails with `AddrInUse`). Refuses to remove
/// anything that is not a socket, so a misconfigured path cannot delete user data.
pub fn bind_replacing_stale(path: &Path) -> io::Result<UnixListener> {
    use std::os::unix::fs::FileTypeExt;

    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path)?,
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "path exists and is not a socket; refusing to remove it",
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    UnixListener::bind(path)
}
