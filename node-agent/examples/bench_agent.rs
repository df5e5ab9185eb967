//! Measures the agent binary the way the kubelet uses it: Allocate latency over its
//! Unix socket (p50 / p99 / max), then resident memory and CPU at steady state.
//!
//! ```text
//! cargo build --release -p tessera-agent --examples --bins
//! target/release/examples/bench_agent target/release/tessera-agent [calls] [idle-seconds]
//! ```
//! The agent runs on the simulated 8×H100 machine (`hack/gpus/h100-8x-nvswitch.yaml`)
//! with `--no-kube`; each call allocates slot 0 of one of the 8 GPUs (round robin), so
//! every call does the full work: slot check, ledger update, checkpoint write.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tessera_device_plugin::testing::FakeKubelet;

fn proc_stat(pid: u32) -> (u64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss_kib = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (ticks, rss_kib)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let bin = args
        .next()
        .expect("usage: bench_agent <tessera-agent binary> [calls] [idle-seconds]");
    let calls: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let idle: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(10);
    let dir = tempfile::tempdir().unwrap();
    let dp = dir.path().join("dp");
    std::fs::create_dir_all(&dp).unwrap();
    let kubelet = FakeKubelet::start(&dp).await.unwrap();
    let shape = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../hack/gpus/h100-8x-nvswitch.yaml"
    );
    let mut child = Command::new(bin)
        .args([
            "run",
            "--node-name",
            "bench",
            "--no-kube",
            "--coordinator",
            "none",
        ])
        .arg(format!("--gpu-backend=sim:{shape}"))
        .arg("--device-plugin-dir")
        .arg(&dp)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .arg("--admin-socket")
        .arg(dir.path().join("admin.sock"))
        .arg("--pod-resources-socket")
        .arg(dir.path().join("none.sock"))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let plugin = kubelet
        .wait_for_plugin("nvidia.com/gpu", Duration::from_secs(10))
        .await
        .unwrap();
    let devices = plugin
        .devices()
        .wait_until(|d| d.len() == 80, Duration::from_secs(5))
        .await
        .unwrap();
    let slots: Vec<String> = devices
        .iter()
        .filter(|d| d.id.ends_with("-0"))
        .map(|d| d.id.clone())
        .collect();
    for i in 0..500 {
        plugin
            .allocate_one(&[&slots[i % slots.len()]])
            .await
            .unwrap();
    }
    let mut lat = Vec::with_capacity(calls);
    for i in 0..calls {
        let t = Instant::now();
        plugin
            .allocate_one(&[&slots[i % slots.len()]])
            .await
            .unwrap();
        lat.push(t.elapsed());
    }
    lat.sort();
    let q = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];
    println!(
        "Allocate over the Unix socket, {calls} calls: p50 {:?}  p99 {:?}  max {:?}",
        q(0.50),
        q(0.99),
        lat[lat.len() - 1]
    );
    let pid = child.id();
    let (t0, _) = proc_stat(pid);
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs(idle)).await;
    let (t1, rss) = proc_stat(pid);
    let hz = 100.0; // USER_HZ on Linux
    let cpu = (t1 - t0) as f64 / hz / start.elapsed().as_secs_f64() * 100.0;
    println!(
        "steady state over {idle}s with 8 GPUs: CPU {cpu:.2}% of one core, RSS {:.1} MiB",
        rss as f64 / 1024.0
    );
    let _ = child.kill();
    let _ = child.wait();
}
