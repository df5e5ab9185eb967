//! Readers for the Alibaba openb trace (cluster-trace-gpu-v2023) and its arrival-order files.
//!
//! The CSVs are plain comma-separated text without quoting. Columns are found by header name, so
//! extra columns are ignored and optional ones (`gpu_spec`) may be absent. Every error names the
//! file, the 1-based line and the column.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use thiserror::Error;

/// A failure to read or parse an openb input file.
#[derive(Debug, Error)]
pub enum CsvError {
    /// The file could not be opened or decompressed.
    #[error("{file}: {source}")]
    Io {
        /// The input file's path as given (`.gz` names included).
        file: String,
        /// Why opening, gunzipping or decoding the file as UTF-8 failed.
        #[source]
        source: std::io::Error,
    },
    /// A header lacks a required column.
    #[error("{file}: line 1: missing column `{column}` (expected header with {expected})")]
    MissingColumn {
        /// The CSV file whose header lacks the column.
        file: String,
        /// The first required header name that is absent.
        column: String,
        /// Every column this kind of file needs, comma-separated, for the message.
        expected: String,
    },
    /// A field has a bad value.
    #[error("{file}: line {line}, column `{column}`: {message}")]
    Field {
        /// The CSV file holding the bad value.
        file: String,
        /// 1-based line number.
        line: usize,
        /// The header name of the column the value is in.
        column: String,
        /// What is wrong and the accepted form.
        message: String,
    },
    /// The file has no header line.
    #[error("{file}: empty file (expected a CSV header line)")]
    Empty {
        /// The CSV file with no header line.
        file: String,
    },
}

/// One GPU node of `openb_node_list_gpu_node.csv`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenbNode {
    /// Node name (`openb-node-NNNN`).
    pub name: String,
    /// CPU capacity in milli-cores.
    pub cpu_milli: u64,
    /// Memory in MiB.
    pub memory_mib: u64,
    /// Number of GPUs.
    pub gpus: u32,
    /// GPU model name (empty for CPU-only nodes).
    pub model: String,
}

/// One pod of an `openb_pod_list_<variant>.csv` (or of an events order file).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenbPod {
    /// Pod name (`openb-pod-NNNN`, clones `<name>-tuned-<k>`).
    pub name: String,
    /// CPU request in milli-cores.
    pub cpu_milli: u64,
    /// Memory request in MiB.
    pub memory_mib: u64,
    /// Number of GPUs (0 = CPU-only).
    pub num_gpu: u32,
    /// Per-GPU share in milli (0 when `num_gpu == 0`; clipped to 1..=1000 otherwise).
    pub gpu_milli: u32,
    /// `|`-separated acceptable GPU models; empty = any.
    pub gpu_spec: String,
}

impl OpenbPod {
    /// Total GPU request in milli (`gpu_milli * num_gpu`).
    pub fn gpu_total(&self) -> u64 {
        u64::from(self.gpu_milli) * u64::from(self.num_gpu)
    }
}

/// One row of an events `_nodes.csv.gz` file: the tie-break prefixed name of a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodePrefix {
    /// `PPPP-<node>`; lexicographically smaller wins ties.
    pub prefixed_name: String,
    /// The plain node name (`openb-node-NNNN`) the prefix belongs to, as in the node list.
    pub node: String,
}

/// Reads a whole file, transparently gunzipping names ending in `.gz`.
pub fn read_text(path: &Path) -> Result<String, CsvError> {
    let file = path.display().to_string();
    let io = |source| CsvError::Io {
        file: file.clone(),
        source,
    };
    let raw = std::fs::read(path).map_err(io)?;
    if path.extension().is_some_and(|e| e == "gz") {
        let mut out = String::new();
        flate2::read::GzDecoder::new(raw.as_slice())
            .read_to_string(&mut out)
            .map_err(io)?;
        Ok(out)
    } else {
        String::from_utf8(raw)
            .map_err(|e| io(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))
    }
}

/// A header-indexed view over CSV text.
struct Table<'a> {
    file: &'a str,
    columns: HashMap<&'a str, usize>,
    rows: Vec<(usize, Vec<&'a str>)>,
}

impl<'a> Table<'a> {
    fn parse(file: &'a str, text: &'a str) -> Result<Table<'a>, CsvError> {
        let mut lines = text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty());
        let Some((_, header)) = lines.next() else {
            return Err(CsvError::Empty {
                file: file.to_string(),
            });
        };
        let columns = header
            .trim_end_matches('\r')
            .split(',')
            .enumerate()
            .map(|(i, c)| (c.trim(), i))
            .collect();
        let rows = lines
            .map(|(i, l)| (i + 1, l.trim_end_matches('\r').split(',').collect()))
            .collect();
        Ok(Table {
            file,
            columns,
            rows,
        })
    }

    fn require(&self, names: &[&str]) -> Result<(), CsvError> {
        for n in names {
            if !self.columns.contains_key(n) {
                return Err(CsvError::MissingColumn {
                    file: self.file.to_string(),
                    column: (*n).to_string(),
                    expected: names.join(","),
                });
            }
        }
        Ok(())
    }

    fn field_err(&self, line: usize, column: &str, message: String) -> CsvError {
        CsvError::Field {
            file: self.file.to_string(),
            line,
            column: column.to_string(),
            message,
        }
    }

    fn text(&self, line: usize, row: &[&'a str], column: &str) -> Result<&'a str, CsvError> {
        match self.columns.get(column) {
            None => Ok(""),
            Some(&i) => row.get(i).map(|s| s.trim()).ok_or_else(|| {
                self.field_err(
                    line,
                    column,
                    format!("missing field (row has {} fields)", row.len()),
                )
            }),
        }
    }

    fn uint(&self, line: usize, row: &[&'a str], column: &str) -> Result<u64, CsvError> {
        let s = self.text(line, row, column)?;
        s.parse::<u64>().map_err(|_| {
            self.field_err(line, column, format!("`{s}` is not a non-negative integer"))
        })
    }
}

/// Parses a node list CSV (`sn,cpu_milli,memory_mib,gpu,model`).
pub fn parse_nodes(file: &str, text: &str) -> Result<Vec<OpenbNode>, CsvError> {
    let t = Table::parse(file, text)?;
    t.require(&["sn", "cpu_milli", "memory_mib", "gpu", "model"])?;
    let mut out = Vec::with_capacity(t.rows.len());
    for (line, row) in &t.rows {
        let name = t.text(*line, row, "sn")?;
        if name.is_empty() {
            return Err(t.field_err(*line, "sn", "empty node name".into()));
        }
        let gpus = t.uint(*line, row, "gpu")?;
        let gpus = u32::try_from(gpus)
            .ok()
            .filter(|g| *g <= 64)
            .ok_or_else(|| t.field_err(*line, "gpu", format!("{gpus} GPUs (accepted: 0..=64)")))?;
        let model = t.text(*line, row, "model")?.to_string();
        if gpus > 0 && model.is_empty() {
            return Err(t.field_err(*line, "model", "empty model on a GPU node".into()));
        }
        out.push(OpenbNode {
            name: name.to_string(),
            cpu_milli: t.uint(*line, row, "cpu_milli")?,
            memory_mib: t.uint(*line, row, "memory_mib")?,
            gpus,
            model,
        });
    }
    Ok(out)
}

/// Parses a pod list CSV (`name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...]`), or an
/// events order file (same columns with `pod` instead of `name`, plus `idx`).
pub fn parse_pods(file: &str, text: &str) -> Result<Vec<OpenbPod>, CsvError> {
    let t = Table::parse(file, text)?;
    let name_col = if t.columns.contains_key("pod") {
        "pod"
    } else {
        "name"
    };
    t.require(&[name_col, "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"])?;
    let mut out = Vec::with_capacity(t.rows.len());
    for (line, row) in &t.rows {
        let name = t.text(*line, row, name_col)?;
        if name.is_empty() {
            return Err(t.field_err(*line, name_col, "empty pod name".into()));
        }
        let num_gpu = t.uint(*line, row, "num_gpu")?;
        let num_gpu = u32::try_from(num_gpu)
            .ok()
            .filter(|n| *n <= 64)
            .ok_or_else(|| {
                t.field_err(
                    *line,
                    "num_gpu",
                    format!("{num_gpu} GPUs (accepted: 0..=64)"),
                )
            })?;
        let raw_milli = t.uint(*line, row, "gpu_milli")?;
        // The published converter clips the share to (0, 1000] and drops it for CPU-only pods.
        let gpu_milli = if num_gpu == 0 {
            0
        } else if raw_milli == 0 {
            return Err(t.field_err(
                *line,
                "gpu_milli",
                "0 on a GPU pod (accepted: 1..=1000 when num_gpu >= 1)".into(),
            ));
        } else {
            raw_milli.min(1000) as u32
        };
        out.push(OpenbPod {
            name: name.to_string(),
            cpu_milli: t.uint(*line, row, "cpu_milli")?,
            memory_mib: t.uint(*line, row, "memory_mib")?,
            num_gpu,
            gpu_milli,
            gpu_spec: t.text(*line, row, "gpu_spec")?.to_string(),
        });
    }
    Ok(out)
}

/// Parses an events `_nodes.csv` file (`prefixed_name,node`).
pub fn parse_prefixes(file: &str, text: &str) -> Result<Vec<NodePrefix>, CsvError> {
    let t = Table::parse(file, text)?;
    t.require(&["prefixed_name", "node"])?;
    let mut out = Vec::with_capacity(t.rows.len());
    for (line, row) in &t.rows {
        let prefixed_name = t.text(*line, row, "prefixed_name")?.to_string();
        let node = t.text(*line, row, "node")?.to_string();
        if node.is_empty() || prefixed_name.is_empty() {
            return Err(t.field_err(*line, "node", "empty node or prefixed name".into()));
        }
        out.push(NodePrefix {
            prefixed_name,
            node,
        });
    }
    Ok(out)
}

/// Reads and parses a node list file.
pub fn read_nodes(path: &Path) -> Result<Vec<OpenbNode>, CsvError> {
    parse_nodes(&path.display().to_string(), &read_text(path)?)
}

/// Reads and parses a pod list or events order file (plain or `.gz`).
pub fn read_pods(path: &Path) -> Result<Vec<OpenbPod>, CsvError> {
    parse_pods(&path.display().to_string(), &read_text(path)?)
}

/// Reads and parses an events node-prefix file (plain or `.gz`).
pub fn read_prefixes(path: &Path) -> Result<Vec<NodePrefix>, CsvError> {
    parse_prefixes(&path.display().to_string(), &read_text(path)?)
}

/// The `_nodes` file that sits beside an `_order` events file, if the name follows the pattern.
pub fn prefixes_beside(order: &Path) -> Option<std::path::PathBuf> {
    let name = order.file_name()?.to_str()?;
    let sibling = name.replace("_order.csv", "_nodes.csv");
    (sibling != name).then(|| order.with_file_name(sibling))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nodes() {
        let text = "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\nn1,32000,1024,0,\n";
        let n = parse_nodes("x.csv", text).unwrap();
        assert_eq!(n.len(), 2);
        assert_eq!(n[0].gpus, 2);
        assert_eq!(n[0].model, "P100");
        assert_eq!(n[1].model, "");
    }

    #[test]
    fn node_errors_name_line_and_column() {
        let text = "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\nn1,lots,1,0,\n";
        let e = parse_nodes("x.csv", text).unwrap_err().to_string();
        assert!(e.contains("line 3"), "{e}");
        assert!(e.contains("cpu_milli"), "{e}");
        assert!(e.contains("`lots`"), "{e}");
        let e = parse_nodes("x.csv", "sn,cpu_milli,gpu,model\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing column `memory_mib`"), "{e}");
        let e = parse_nodes("x.csv", "").unwrap_err().to_string();
        assert!(e.contains("empty file"), "{e}");
        let text = "sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,2\n";
        let e = parse_nodes("x.csv", text).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("`model`"), "{e}");
    }

    #[test]
    fn parses_pods_with_and_without_spec() {
        let text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos\n\
                    p0,8000,30517,0,0,,BE\np1,6000,12288,1,460,T4|P100,LS\np2,1,1,2,1500,,LS\n";
        let p = parse_pods("p.csv", text).unwrap();
        assert_eq!(p[0].gpu_milli, 0);
        assert_eq!(p[1].gpu_spec, "T4|P100");
        assert_eq!(p[2].gpu_milli, 1000, "clipped to a whole GPU");
        assert_eq!(p[2].gpu_total(), 2000);
        let text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,1,500\n";
        assert_eq!(parse_pods("p.csv", text).unwrap()[0].gpu_spec, "");
    }

    #[test]
    fn pod_errors_name_line_and_column() {
        let text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,1,500\np1,1,1,-1,0\n";
        let e = parse_pods("p.csv", text).unwrap_err().to_string();
        assert!(e.contains("p.csv: line 3, column `num_gpu`"), "{e}");
        let text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,1,0\n";
        let e = parse_pods("p.csv", text).unwrap_err().to_string();
        assert!(
            e.contains("line 2, column `gpu_milli`") && e.contains("1..=1000"),
            "{e}"
        );
    }

    #[test]
    fn parses_events_files() {
        let text = "idx,pod,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n\
                    0,openb-pod-0255,8000,30517,0,0,\n1,openb-pod-1-tuned-0,3152,5600,1,810,\n";
        let p = parse_pods("o.csv", text).unwrap();
        assert_eq!(p[1].name, "openb-pod-1-tuned-0");
        let text = "prefixed_name,node\n0601-n0,n0\n";
        assert_eq!(
            parse_prefixes("n.csv", text).unwrap()[0].prefixed_name,
            "0601-n0"
        );
        let e = parse_prefixes("n.csv", "prefixed_name\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("`node`"), "{e}");
    }

    #[test]
    fn sibling_prefix_file_name() {
        let p = prefixes_beside(Path::new("/d/default_s42_order.csv.gz")).unwrap();
        assert_eq!(p, Path::new("/d/default_s42_nodes.csv.gz"));
        assert!(prefixes_beside(Path::new("/d/other.csv")).is_none());
    }
}
