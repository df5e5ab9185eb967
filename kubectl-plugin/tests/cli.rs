//! The command line as a user meets it before any API server is involved: bad flags and bad
//! kubeconfigs are named, with the accepted form, and nothing panics.
//!
//! Being an integration test, this also makes `cargo test --workspace` build the
//! `kubectl-tessera` binary, which the coordinator's end-to-end tests run against the real API
//! server.

use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kubectl-tessera"))
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .expect("kubectl-tessera runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_missing_kubeconfig_is_named() {
    let out = run(&["--kubeconfig", "/nonexistent/tessera-kc", "gpus"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("--kubeconfig /nonexistent/tessera-kc"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn a_kubeconfig_that_is_not_yaml_is_named_with_the_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("kubeconfig");
    std::fs::write(&path, "garbage: [\n").expect("write");
    let out = run(&["--kubeconfig", path.to_str().expect("utf-8 path"), "queues"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("--kubeconfig"), "{err}");
    assert!(err.contains("line 1"), "{err}");
}

#[test]
fn bad_flags_name_the_flag_and_the_accepted_range() {
    let out = run(&["top", "--interval", "0"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("--interval"), "{err}");
    assert!(err.contains("1..=3600"), "{err}");

    let out = run(&["why"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("<POD>"), "{}", stderr(&out));

    let out = run(&["why", "p", "-l", "job-name=x"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("cannot be used with"),
        "{}",
        stderr(&out)
    );
}
