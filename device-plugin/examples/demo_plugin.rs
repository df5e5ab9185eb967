//! A stand-alone device plugin advertising fake devices, for trying the library
//! against a real kubelet or the fake one.
//!
//! ```text
//! cargo run -p tessera-device-plugin --example demo_plugin -- \
//!     [--dir /var/lib/kubelet/device-plugins/] [--resource example.com/demo] [--devices 4]
//! ```
//!
//! Every Allocate answers with `DEMO_DEVICES=<ids>`. Stops cleanly (socket removed) on
//! SIGTERM or Ctrl-C.

use std::error::Error;

use tessera_device_plugin::{
    Device, DeviceList, DeviceProvider, DeviceWatch, PluginConfig, PluginServer, ProviderError, api,
};

struct Demo {
    devices: DeviceList,
}

#[tonic::async_trait]
impl DeviceProvider for Demo {
    fn devices(&self) -> DeviceWatch {
        self.devices.watch()
    }

    async fn allocate(
        &self,
        request: api::AllocateRequest,
    ) -> Result<api::AllocateResponse, ProviderError> {
        let container_responses = request
            .container_requests
            .into_iter()
            .map(|c| {
                let mut response = api::ContainerAllocateResponse::default();
                response
                    .envs
                    .insert("DEMO_DEVICES".into(), c.devices_ids.join(","));
                response
            })
            .collect();
        Ok(api::AllocateResponse {
            container_responses,
        })
    }
}

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().collect();
    let resource = flag(&args, "--resource").unwrap_or_else(|| "example.com/demo".into());
    let count: usize = match flag(&args, "--devices") {
        Some(n) => n
            .parse()
            .map_err(|_| format!("--devices {n:?}: expected a whole number such as 4"))?,
        None => 4,
    };
    let mut config = PluginConfig::new(resource)?;
    if let Some(dir) = flag(&args, "--dir") {
        config = config.with_socket_dir(dir);
    }
    let devices = DeviceList::new(
        (0..count)
            .map(|i| Device::healthy(format!("demo-{i}")))
            .collect(),
    );
    println!(
        "serving {count} devices on {}",
        config.socket_path().display()
    );
    PluginServer::new(config, Demo { devices })
        .run_until_signal()
        .await?;
    println!("stopped");
    Ok(())
}
