//! `tessera-deploy-check`: renders the Helm chart without Helm, writes the plain manifests,
//! and lints the chart.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use tessera_deploy_check::chart::{Chart, Release, parse_yaml};
use tessera_deploy_check::{kinds, lint, manifests};

/// Renders and checks deploy/helm/tessera where Helm is not installed.
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
    /// Regenerate deploy/manifests/ (and the chart's copy of deploy/crds/) from the chart's
    /// default values.
    Render {
        /// Where the manifests go.
        #[arg(long, default_value = manifests::MANIFESTS_DIR)]
        out: PathBuf,
        /// Write nothing; fail if a generated file is out of date.
        #[arg(long)]
        check: bool,
    },
    /// Print the chart rendered with extra values files, like `helm template`.
    Template {
        /// Values files merged over values.yaml, in order.
        #[arg(long = "values", short = 'f')]
        values: Vec<PathBuf>,
        /// Release name.
        #[arg(long, default_value = "tessera")]
        name: String,
        /// Release namespace.
        #[arg(long, default_value = "tessera-system")]
        namespace: String,
    },
    /// Check that every value is documented, every value a template reads exists, and every
    /// rendered document parses into its Kubernetes type.
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

fn overrides(files: &[PathBuf]) -> anyhow::Result<Vec<serde_yaml_ng::Value>> {
    files
        .iter()
        .map(|f| {
            let text =
                std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
            Ok(parse_yaml(f, &text)?)
        })
        .collect()
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
        Command::Template {
            values,
            name,
            namespace,
        } => {
            let chart = Chart::load(&repo.join(manifests::CHART_DIR))?;
            let rendered = chart.render(&Release { name, namespace }, &overrides(&values)?)?;
            for r in rendered {
                for doc in r.documents {
                    println!("---\n# Source: {}\n{doc}", r.source);
                }
            }
        }
        Command::Lint { values } => {
            let chart = Chart::load(&repo.join(manifests::CHART_DIR))?;
            let mut problems = Vec::new();
            for key in lint::undocumented_values(&chart.values_source) {
                problems.push(format!("values.yaml: {key} has no comment"));
            }
            for r in lint::undefined_value_refs(&chart.template_sources, &chart.values) {
                problems.push(format!("{r} is not in values.yaml"));
            }
            let rendered = chart.render(&Release::default(), &overrides(&values)?)?;
            for r in &rendered {
                for doc in &r.documents {
                    let json = kinds::to_json(doc).map_err(anyhow::Error::msg)?;
                    if let Err(e) = kinds::check(&json) {
                        problems.push(format!("{}: {e}", r.source));
                    }
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
