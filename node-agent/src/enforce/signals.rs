//! Sending SIGSTOP / SIGCONT / SIGKILL to GPU processes, behind a trait so the
//! benchmark and unit tests can count signals without sending any.
//!
//! The real implementation refuses PIDs that can never be a container's process here
//! (0 and negative values address process groups, 1 is init, and the agent itself),
//! so a bad reading can never signal a group or the agent.

use nix::errno::Errno;
use nix::sys::signal::{self, Signal as NixSignal};
use nix::unistd::Pid;
use parking_lot::Mutex;

/// The signals the watchdog sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Signal {
    /// Pause (duty-cycling).
    Stop,
    /// Resume.
    Cont,
    /// Kill (memory over the limit).
    Kill,
}

impl Signal {
    fn to_nix(self) -> NixSignal {
        match self {
            Signal::Stop => NixSignal::SIGSTOP,
            Signal::Cont => NixSignal::SIGCONT,
            Signal::Kill => NixSignal::SIGKILL,
        }
    }
}

/// A signal could not be sent.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SignalError {
    /// The PID is one the watchdog must never signal.
    #[error("refusing to signal pid {0}: not a container process")]
    Refused(u32),
    /// `kill(2)` failed for a reason other than the process being gone (e.g. `EPERM`).
    #[error("cannot send {signal:?} to pid {pid}: {errno}")]
    Failed {
        /// Host PID the signal was for.
        pid: u32,
        /// What was being sent (stop, continue or kill).
        signal: Signal,
        /// The errno `kill(2)` returned.
        errno: Errno,
    },
}

/// Something that delivers signals to processes.
pub trait Signaller: Send + Sync + 'static {
    /// Sends `signal` to `pid`. A process that is already gone is not an error.
    fn send(&self, pid: u32, signal: Signal) -> Result<(), SignalError>;
}

/// Real signals through `kill(2)`.
#[derive(Debug, Default, Clone, Copy)]
pub struct KernelSignals;

impl Signaller for KernelSignals {
    fn send(&self, pid: u32, signal: Signal) -> Result<(), SignalError> {
        if pid <= 1 || pid > i32::MAX as u32 || pid == std::process::id() {
            return Err(SignalError::Refused(pid));
        }
        match signal::kill(Pid::from_raw(pid as i32), signal.to_nix()) {
            Ok(()) | Err(Errno::ESRCH) => Ok(()),
            Err(errno) => Err(SignalError::Failed { pid, signal, errno }),
        }
    }
}

/// Records signals instead of sending them (tests, benchmarks).
#[derive(Debug, Default)]
pub struct RecordedSignals {
    sent: Mutex<Vec<(u32, Signal)>>,
}

impl RecordedSignals {
    /// Everything "sent" so far, in order.
    pub fn sent(&self) -> Vec<(u32, Signal)> {
        self.sent.lock().clone()
    }

    /// Forgets what was recorded.
    pub fn clear(&self) {
        self.sent.lock().clear();
    }
}

impl Signaller for RecordedSignals {
    fn send(&self, pid: u32, signal: Signal) -> Result<(), SignalError> {
        self.sent.lock().push((pid, signal));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_signals_groups_init_or_itself() {
        for pid in [0, 1, std::process::id(), u32::MAX] {
            assert_eq!(
                KernelSignals.send(pid, Signal::Kill),
                Err(SignalError::Refused(pid))
            );
        }
    }

    #[test]
    fn stop_cont_and_kill_a_real_child() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        KernelSignals.send(pid, Signal::Stop).unwrap();
        KernelSignals.send(pid, Signal::Cont).unwrap();
        KernelSignals.send(pid, Signal::Kill).unwrap();
        let status = child.wait().unwrap();
        assert!(!status.success());
        // Gone (and reaped): not an error.
        KernelSignals.send(pid, Signal::Cont).unwrap();
    }
}
