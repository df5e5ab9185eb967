//! The admin socket against a hostile or unlucky client, on the `tessera-agent` binary:
//! its mode is 0600 from the moment it can be seen, a 400 MiB request line costs the agent
//! nothing, running out of file descriptors makes it back off rather than spin, and
//! whatever is sent gets an answer.

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::{AgentProcess, proc_stat};
use tessera_agent::admin::{self, Response};
use tessera_testcluster::{eventually, until};

/// A field of `/proc/<pid>/status` in kB (`VmHWM`: the peak resident set).
fn status_kb(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in {text}"))
}

/// How many files process `pid` holds open.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

fn run_agent(dir: &Path, nofile: Option<u32>) -> AgentProcess {
    AgentProcess::spawn(dir, "l40s-4x-pcie.yaml", nofile)
}

/// Waits until the agent at `socket` answers `status`.
async fn wait_serving(socket: &Path) {
    eventually("the admin socket answers status", || async {
        matches!(
            admin::request(socket, "status").await,
            Ok(Response::Status(_))
        )
        .then_some(())
    })
    .await;
}

/// Sends `bytes` as one request and returns the agent's answer line.
fn raw_request(socket: &Path, bytes: &[u8]) -> String {
    let mut stream = UnixStream::connect(socket).unwrap();
    stream.write_all(bytes).unwrap();
    stream.shutdown(std::net::Shutdown::Write).unwrap();
    let mut answer = String::new();
    BufReader::new(stream).read_line(&mut answer).unwrap();
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_socket_is_never_visible_with_a_mode_other_than_0600() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("admin.sock");
    // A watcher looks at the path as fast as it can while the socket is bound again and
    // again: any moment between bind and chmod where it is reachable would be seen.
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (done, path) = (Arc::clone(&done), path.clone());
        std::thread::spawn(move || {
            let mut seen = 0u64;
            while !done.load(Ordering::Relaxed) {
                if let Ok(meta) = std::fs::symlink_metadata(&path)
                    && meta.file_type().is_socket()
                {
                    seen += 1;
                    let mode = meta.permissions().mode() & 0o777;
                    assert_eq!(mode, 0o600, "the socket was visible with mode {mode:o}");
                }
            }
            seen
        })
    };
    for _ in 0..300 {
        let listener = admin::bind(&path).unwrap();
        drop(listener);
        std::fs::remove_file(&path).unwrap();
    }
    done.store(true, Ordering::Relaxed);
    let seen = watcher
        .join()
        .expect("no socket was seen with another mode");
    println!("the watcher saw the socket {seen} times, always 0600");
    // Nothing is left beside it but the socket itself.
    let _listener = admin::bind(&path).unwrap();
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["admin.sock"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_400_mib_request_line_leaves_the_agent_small_and_serving() {
    let dir = tempfile::tempdir().unwrap();
    let agent = run_agent(dir.path(), None);
    let socket = dir.path().join("admin.sock");
    wait_serving(&socket).await;
    let before_kb = status_kb(agent.pid(), "VmHWM");

    // 400 MiB without a newline, streamed a MiB at a time (never held by the test): the
    // agent stops reading at its cap, answers and closes, and the writes fail from then on.
    let answer = {
        let socket = socket.clone();
        tokio::task::spawn_blocking(move || {
            let mut stream = UnixStream::connect(&socket).unwrap();
            let chunk = vec![b'x'; 1 << 20];
            let mut sent = 0usize;
            for _ in 0..400 {
                if stream.write_all(&chunk).is_err() {
                    break;
                }
                sent += chunk.len();
            }
            // Ends the line for an agent still reading it (the agent closed its end already
            // when it kept to its cap).
            let _ = stream.shutdown(std::net::Shutdown::Write);
            let mut answer = Vec::new();
            // The answer is read back even though the agent closed on unread bytes.
            let _ = stream.read_to_end(&mut answer);
            println!("sent {} MiB before the agent closed", sent >> 20);
            String::from_utf8_lossy(&answer).into_owned()
        })
        .await
        .unwrap()
    };
    assert!(
        answer.contains("request line longer than 4096 bytes"),
        "answer: {answer:?}"
    );
    let after_kb = status_kb(agent.pid(), "VmHWM");
    println!("agent peak RSS {before_kb} kB before, {after_kb} kB after");
    assert!(
        after_kb < before_kb + 32 * 1024,
        "the agent's peak RSS grew from {before_kb} kB to {after_kb} kB"
    );
    wait_serving(&socket).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whatever_is_sent_gets_an_answer() {
    let dir = tempfile::tempdir().unwrap();
    let _agent = run_agent(dir.path(), None);
    let socket = dir.path().join("admin.sock");
    wait_serving(&socket).await;
    let socket2 = socket.clone();
    let answers = tokio::task::spawn_blocking(move || {
        [
            raw_request(&socket2, b"sta\xff\xfetus\n"),
            raw_request(&socket2, b"reboot\n"),
            raw_request(&socket2, b""),
            raw_request(&socket2, b"inject-xid 99 79\n"),
        ]
    })
    .await
    .unwrap();
    let errors: Vec<String> = answers
        .iter()
        .map(|a| match serde_json::from_str::<Response>(a) {
            Ok(Response::Error(e)) => e,
            other => panic!("not an error line: {a:?} ({other:?})"),
        })
        .collect();
    assert!(
        errors[0].starts_with("request is not UTF-8 text"),
        "{}",
        errors[0]
    );
    assert!(
        errors[1].starts_with("unknown request \"reboot\""),
        "{}",
        errors[1]
    );
    assert!(
        errors[2].starts_with("unknown request \"\""),
        "{}",
        errors[2]
    );
    // A known request refused for a reason of its own.
    assert_eq!(errors[3], "no GPU with index 99");
    for e in &errors[..3] {
        assert!(e.contains("expected `status`, `topology`"), "{e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_out_of_file_descriptors_backs_off_and_serves_again() {
    const NOFILE: u32 = 48;
    let dir = tempfile::tempdir().unwrap();
    let agent = run_agent(dir.path(), Some(NOFILE));
    let socket = dir.path().join("admin.sock");
    wait_serving(&socket).await;
    println!("the agent holds {} files at rest", open_fds(agent.pid()));

    // Connections that send nothing hold one descriptor each in the agent until its read
    // timeout: open them until the agent has none left (the rest wait in the backlog, and
    // every accept fails with EMFILE).
    let mut held = Vec::new();
    eventually("the agent to run out of file descriptors", || {
        for _ in 0..8 {
            if let Ok(s) = UnixStream::connect(&socket) {
                held.push(s);
            }
        }
        let full = open_fds(agent.pid()) >= NOFILE as usize - 1;
        async move { full.then_some(()) }
    })
    .await;
    // Over a few seconds out of descriptors, the agent sleeps between retries: a busy
    // accept loop would take a whole core.
    let (ticks_before, at) = (proc_stat(agent.pid()).1, std::time::Instant::now());
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let (ticks, wall) = (proc_stat(agent.pid()).1 - ticks_before, at.elapsed());
    let still_full = open_fds(agent.pid()) >= NOFILE as usize - 1;
    println!(
        "{} connections open; the agent used {ticks} ticks of CPU in {wall:?}, still out of \
         descriptors: {still_full}",
        held.len()
    );
    assert!(
        still_full,
        "the agent got descriptors back during the measurement; it says nothing"
    );
    // Clock ticks are 1/100 s: at most a tenth of the wall time, where spinning takes all.
    let bound = wall.as_millis() as u64 / 100;
    assert!(
        ticks <= bound,
        "the agent used {ticks} ticks of CPU in {wall:?} out of descriptors (bound {bound})"
    );

    drop(held);
    wait_serving(&socket).await;
    until("the agent closes the connections it answered", || {
        open_fds(agent.pid()) < NOFILE as usize / 2
    })
    .await;
}
