//! Allocate round-trip latency over the plugin's Unix socket.
//!
//! Reproduce: `cargo bench -p tessera-device-plugin --bench allocate`
//! (add `-- --measurement-time 5` for a shorter criterion run). After criterion's own
//! report, a second pass times `ALLOCATE_SAMPLES` (default 20000) individual calls and
//! prints p50/p90/p99/p99.9, which criterion's mean/median summary does not give.
//!
//! The plugin serves 8 GPUs x 10 slots; each call allocates one slot and gets back the
//! environment and CDI device a real Tessera Allocate returns. Client and server run
//! in one process, so the figure includes both sides' gRPC/HTTP2 work and the socket.

use std::time::{Duration, Instant};

use criterion::Criterion;
use tessera_device_plugin::api::device_plugin_client::DevicePluginClient;
use tessera_device_plugin::{
    Device, DeviceList, DeviceProvider, DeviceWatch, PluginConfig, PluginServer, ProviderError,
    api, uds,
};
use tokio::runtime::Runtime;

struct BenchProvider {
    devices: DeviceList,
}

#[tonic::async_trait]
impl DeviceProvider for BenchProvider {
    fn devices(&self) -> DeviceWatch {
        self.devices.watch()
    }

    async fn allocate(
        &self,
        request: api::AllocateRequest,
    ) -> Result<api::AllocateResponse, ProviderError> {
        let container_responses = request
            .container_requests
            .iter()
            .map(|c| {
                let gpu = c.devices_ids[0].rsplit_once('-').map_or("", |(g, _)| g);
                let mut response = api::ContainerAllocateResponse::default();
                response
                    .envs
                    .insert("NVIDIA_VISIBLE_DEVICES".into(), gpu.to_owned());
                response
                    .envs
                    .insert("TESSERA_GPU_MEMORY_LIMIT_MIB".into(), "8192".into());
                response
                    .envs
                    .insert("TESSERA_GPU_COMPUTE_PERCENT".into(), "10".into());
                response.cdi_devices.push(api::CdiDevice {
                    name: format!("nvidia.com/gpu={gpu}"),
                });
                response
            })
            .collect();
        Ok(api::AllocateResponse {
            container_responses,
        })
    }
}

fn request(i: usize) -> api::AllocateRequest {
    api::AllocateRequest {
        container_requests: vec![api::ContainerAllocateRequest {
            devices_ids: vec![format!("GPU-{:08x}-{}", i % 8, i % 10)],
        }],
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--test" || a == "--list");
    let rt = Runtime::new().expect("tokio runtime");
    let dir = tempfile::tempdir().expect("temp dir");

    let devices = (0..8)
        .flat_map(|g| (0..10).map(move |s| Device::healthy(format!("GPU-{g:08x}-{s}"))))
        .collect();
    let provider = BenchProvider {
        devices: DeviceList::new(devices),
    };
    let config = PluginConfig::new("nvidia.com/gpu")
        .expect("valid resource name")
        .with_socket_dir(dir.path());
    let socket = config.socket_path();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    // No kubelet: the plugin serves and keeps waiting for kubelet.sock, which does
    // not affect the DevicePlugin service being measured.
    let server = rt.spawn(PluginServer::new(config, provider).run(async move {
        let _ = stopped.await;
    }));
    let mut client = rt.block_on(async {
        for _ in 0..500 {
            if let Ok(channel) = uds::connect(socket.clone()).await {
                return DevicePluginClient::new(channel);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("plugin socket {} never came up", socket.display());
    });

    let mut criterion = Criterion::default().configure_from_args();
    let mut i = 0usize;
    criterion.bench_function("allocate_round_trip_uds", |b| {
        b.iter(|| {
            i += 1;
            rt.block_on(client.allocate(request(i)))
                .expect("allocate succeeds")
        })
    });
    criterion.final_summary();

    if !quick {
        let samples = std::env::var("ALLOCATE_SAMPLES")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(20_000usize);
        let mut latencies = rt.block_on(async {
            for i in 0..1_000 {
                client.allocate(request(i)).await.expect("warm-up allocate");
            }
            let mut latencies = Vec::with_capacity(samples);
            for i in 0..samples {
                let start = Instant::now();
                client.allocate(request(i)).await.expect("allocate");
                latencies.push(start.elapsed());
            }
            latencies
        });
        latencies.sort_unstable();
        let at = |q: f64| {
            let rank = ((latencies.len() as f64) * q).ceil() as usize;
            latencies[rank.clamp(1, latencies.len()) - 1]
        };
        println!(
            "allocate_round_trip_uds percentiles over {samples} calls: p50 {:?}  p90 {:?}  \
             p99 {:?}  p99.9 {:?}  max {:?}",
            at(0.50),
            at(0.90),
            at(0.99),
            at(0.999),
            latencies[latencies.len() - 1]
        );
    }

    let _ = stop.send(());
    let _ = rt.block_on(server);
}
