//! `tessera-deploy-check`: writes the plain manifests from `helm template`, and lints the
//! chart with `helm lint` and the checks helm does not do.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use tessera_deploy_check::chart::{self, Chart, Release};
use tessera_deploy_check::{kinds, lint, manifests};

/// Generates and checks what deploy/helm/tessera produces, with the real helm (hack/k8s's
/// `kube-peer helm`; `KUBE_PEER` names a prebuilt one).
#[derive(Parser, Debug)]
#[command(name = "tessera-deploy-check", version, about)]
struct Cli {
    /// Repository root (default: the nearest directory above the current one holding
    /// deploy/helm/tessera).
    #[arg(long, global = true)]
    repo: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Regenerate deploy/manifests/ (`helm template` with the chart's default values) and
    /// the chart's copy of deploy/crds/.
    Render {
        /// Where the manifests go.
        #[arg(long, default_value = manifests::MANIFESTS_DIR)]
        out: PathBuf,
        /// Write nothing; fail if a generated file is out of date.
        #[arg(long)]
        check: bool,
    },
    /// `helm lint --strict`, then: every value is documented, every value a template reads
    /// exists, and every document `helm template` renders parses into its Kubernetes type.
    Lint {
        /// Values files merged over values.yaml, in order.
        #[arg(long = "values", short = 'f')]
        values: Vec<PathBuf>,
    },
}

fn find_repo(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(repo) = given {
        return Ok(repo);
    }
    let cwd = std::env::current_dir().context("reading the current directory")?;
    cwd.ancestors()
        .find(|d| d.join(manifests::CHART_DIR).is_dir())
        .map(Path::to_path_buf)
        .with_context(|| {
            format!(
                "no {} above {}; pass --repo",
                manifests::CHART_DIR,
                cwd.display()
            )
        })
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let repo = find_repo(cli.repo)?;
    match cli.command {
        Command::Render { out, check } => {
            if check {
                let stale = manifests::stale(&repo)?;
                if !stale.is_empty() {
                    let list: Vec<String> = stale.iter().map(|p| p.display().to_string()).collect();
                    bail!(
                        "out of date: {}; run `cargo run -p tessera-deploy-check -- render`",
                        list.join(", ")
                    );
                }
                println!("generated files are up to date");
            } else {
                let out = if out.is_absolute() {
                    out
                } else {
                    repo.join(out)
                };
                for path in manifests::write(&repo, Some(&out))? {
                    println!("wrote {}", path.display());
                }
            }
        }
        Command::Lint { values } => {
            let dir = repo.join(manifests::CHART_DIR);
            print!("{}", chart::lint(&dir, &values)?);
            let chart = Chart::load(&dir)?;
            let mut problems = Vec::new();
            for key in lint::undocumented_values(&chart.values_source) {
                problems.push(format!("values.yaml: {key} has no comment"));
            }
            for r in lint::undefined_value_refs(&chart.template_sources, &chart.values) {
                problems.push(format!("{r} is not in values.yaml"));
            }
            for r in chart::render(&dir, &Release::default(), &values)? {
                let json = kinds::to_json(&r.text).map_err(anyhow::Error::msg)?;
                if let Err(e) = kinds::check(&json) {
                    problems.push(format!("{}: {e}", r.source));
                }
            }
            if !problems.is_empty() {
                bail!("{} problem(s):\n{}", problems.len(), problems.join("\n"));
            }
            println!("chart {} {}: ok", chart.meta.name, chart.meta.version);
        }
    }
    Ok(())
}
