//! Telling whether a socket file is still the one we saw earlier.
//!
//! A restarted kubelet deletes the sockets in its device-plugin directory and creates
//! a new `kubelet.sock`. Comparing device, inode and change time catches the new file
//! even when the file system hands the old inode number out again.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Identity of one file-system object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileIdentity {
    dev: u64,
    ino: u64,
    ctime: i64,
    ctime_nsec: i64,
}

impl FileIdentity {
    /// The identity of `path`, `None` when it does not exist.
    pub(crate) fn of(path: &Path) -> io::Result<Option<Self>> {
        match std::fs::symlink_metadata(path) {
            Ok(meta) => Ok(Some(Self {
                dev: meta.dev(),
                ino: meta.ino(),
                ctime: meta.ctime(),
                ctime_nsec: meta.ctime_nsec(),
            })),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Whether `path` is still this object. Errors other than absence count as "still
    /// there": a transient stat failure must not tear down a working registration.
    pub(crate) fn still_at(&self, path: &Path) -> bool {
        match Self::of(path) {
            Ok(Some(now)) => now == *self,
            Ok(None) => false,
            Err(_) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recreated_file_is_a_different_identity() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubelet.sock");
        assert_eq!(FileIdentity::of(&path).unwrap(), None);
        let first = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let before = FileIdentity::of(&path).unwrap().unwrap();
        assert!(before.still_at(&path));
        drop(first);
        std::fs::remove_file(&path).unwrap();
        assert!(!before.still_at(&path));
        // File-system timestamps can be tick-coarse; a restarting kubelet is far slower.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let _second = std::os::unix::net::UnixListener::bind(&path).unwrap();
        assert!(!before.still_at(&path));
    }
}
