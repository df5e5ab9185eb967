//! The one polling loop the cluster tests share.

use std::time::Duration;

use crate::DEADLINE;

/// How often a condition on the real components is looked at again.
const POLL: Duration = Duration::from_millis(50);

/// Polls `probe` until it answers, or fails the test after [`DEADLINE`] with `what` and the
/// picture `describe` gives (logs, the cluster's objects): a timeout on a real component is
/// only diagnosable with what the peers saw.
pub async fn wait_for<T, F, Fut, D, DFut>(what: &str, mut probe: F, describe: D) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
    D: FnOnce() -> DFut,
    DFut: Future<Output = String>,
{
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!(
                "timed out after {DEADLINE:?} waiting for {what}\n{}",
                describe().await
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// [`wait_for`] for conditions the test itself holds the whole picture of: the failure
/// names `what` and nothing more.
pub async fn eventually<T, F, Fut>(what: &str, probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    wait_for(what, probe, || async { String::new() }).await
}

/// Polls the synchronous check `done` (a ledger, a file the test reads) until it holds, or
/// fails after [`DEADLINE`] naming `what`.
pub async fn until(what: &str, mut done: impl FnMut() -> bool) {
    eventually(what, || {
        let held = done();
        async move { held.then_some(()) }
    })
    .await
}
